package config

import (
	"reflect"
	"strconv"
	"strings"
)

// hint suggests the key that was probably meant, for an unknown key.
func hint(key []string) string {
	if len(key) == 0 {
		return ""
	}
	parent, last := key[:len(key)-1], key[len(key)-1]
	t, ok := fieldType(parent)
	if !ok {
		return ""
	}
	t = tableElem(t)
	if t.Kind() != reflect.Struct {
		return ""
	}
	if h := secretHint(t, last); h != "" {
		return h
	}
	best, bestDist := "", 3
	for f := range tomlFields(t) {
		n := tomlName(f)
		if n == "" || n == "-" {
			continue
		}
		if strings.HasPrefix(n, last+"_") {
			return "; did you mean " + strconv.Quote(n) + "?"
		}
		if d := editDistance(strings.ToLower(last), n); d < bestDist {
			best, bestDist = n, d
		}
	}
	if best == "" {
		return ""
	}
	return "; did you mean " + strconv.Quote(best) + "?"
}

// secretHint explains, for an unknown key that looks like a secret written
// into the file, where that secret goes instead.
func secretHint(t reflect.Type, key string) string {
	switch {
	case t == reflect.TypeFor[Upstream]() && (key == "api_key" || key == "key"):
		return "; keys stay out of the file: put the key in an environment variable and name it in api_key_env"
	case t == reflect.TypeFor[Key]() && (key == "key" || key == "api_key" || key == "secret" || key == "token"):
		return "; the key itself stays out of the file: put its SHA-256 in sha256 (`gateway hash-key` prints it)"
	case t == reflect.TypeFor[Redis]() && key == "password":
		return "; the password stays out of the file: put it in an environment variable and name it in password_env"
	case t == reflect.TypeFor[Admin]() && key == "token":
		return "; the token stays out of the file: put it in an environment variable and name it in token_env"
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
