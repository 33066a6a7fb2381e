package config

import (
	"errors"
	"iter"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// fieldError is one problem with a configuration, tied to a key path where
// there is one so that Parse can point at the line that set it. Its text is
// "config: <file>:<line>: <key>: <problem>", parts left out when unknown.
type fieldError struct {
	file string // set by Parse
	line int    // 1-based; 0 when unknown
	col  int    // 1-based; only given for syntax errors
	key  string // e.g. "upstreams[0].base_url"; "" for the whole file
	msg  string
}

func (e *fieldError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.file != "" {
		b.WriteString(e.file)
		if e.line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.line))
			if e.col > 0 {
				b.WriteByte(':')
				b.WriteString(strconv.Itoa(e.col))
			}
		}
		b.WriteString(": ")
	}
	if e.key != "" {
		b.WriteString(e.key)
		b.WriteString(": ")
	}
	b.WriteString(e.msg)
	return b.String()
}

// decodeError turns go-toml's errors into fieldErrors that name the file, the
// line and the key, with array-table indexes filled in ("upstreams[1].x"),
// which go-toml's keys leave out.
func decodeError(err error, name string, idx *docIndex) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) {
		errs := make([]error, 0, len(sm.Errors))
		for i := range sm.Errors {
			de := &sm.Errors[i]
			line, _ := de.Position()
			msg := "unknown key"
			if strings.HasSuffix(de.Error(), "missing table") {
				msg = "unknown table"
			}
			errs = append(errs, &fieldError{
				file: name,
				line: line,
				key:  idx.keyPath(de.Key(), line),
				msg:  msg + hint(de.Key()),
			})
		}
		return errors.Join(errs...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col := de.Position()
		fe := &fieldError{
			file: name,
			line: line,
			key:  idx.keyPath(de.Key(), line),
			msg:  typeMessage(strings.TrimPrefix(de.Error(), "toml: "), de.Key()),
		}
		if idx.syntaxErr {
			fe.col = col
			fe.msg = "invalid TOML: " + fe.msg
		}
		return fe
	}
	return &fieldError{file: name, msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// mismatchRE matches go-toml's type mismatch message, whose Go type names
// mean little to someone editing gateway.toml.
var mismatchRE = regexp.MustCompile(`^cannot decode TOML (.+?) into (?:struct field \S+ of type )?(.+)$`)

// typeMessage rewrites a type mismatch as "must be a boolean, not a string";
// any other message is returned as it is.
func typeMessage(msg string, key []string) string {
	m := mismatchRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	found, goType := m[1], m[2]
	t, ok := fieldType(key)
	if !ok {
		return msg
	}
	if t.Kind() == reflect.Pointer {
		// go-toml names the pointed-to type of an optional value.
		t = t.Elem()
	}
	switch {
	case t.String() == goType:
		return "must be " + describe(t) + ", not " + withArticle(found)
	case t.Kind() == reflect.Slice && t.Elem().String() == goType:
		return "each element must be " + describe(t.Elem()) + ", not " + withArticle(found)
	case t.Kind() == reflect.Map && t.Elem().String() == goType:
		return "each value must be " + describe(t.Elem()) + ", not " + withArticle(found)
	}
	return msg
}

// fieldType returns the Go type that the TOML key decodes into. Array-table
// indexes are absent from key, so slices of structs are stepped through.
func fieldType(key []string) (reflect.Type, bool) {
	t := reflect.TypeFor[Config]()
	for _, part := range key {
		t = tableElem(t)
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldByTag(t, part)
			if !ok {
				return nil, false
			}
			t = f.Type
		case reflect.Map:
			t = t.Elem()
		default:
			return nil, false
		}
	}
	return t, true
}

// tableElem returns the element type of an array of tables, else t.
func tableElem(t reflect.Type) reflect.Type {
	if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
		return t.Elem()
	}
	return t
}

func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return name
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for f := range tomlFields(t) {
		if name != "-" && tomlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// tomlFields yields the fields of struct type t as TOML sees them: the
// fields of an embedded struct without a toml tag (Limits in Team and Key)
// are yielded in its place, as if declared in t.
func tomlFields(t reflect.Type) iter.Seq[reflect.StructField] {
	return func(yield func(reflect.StructField) bool) {
		for f := range t.Fields() {
			if f.Anonymous && tomlName(f) == "" && f.Type.Kind() == reflect.Struct {
				for ef := range tomlFields(f.Type) {
					if !yield(ef) {
						return
					}
				}
				continue
			}
			if !yield(f) {
				return
			}
		}
	}
}

// describe names a Go type as the TOML value a user must write.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			return "an array of tables"
		}
		return "an array of " + plural(t.Elem())
	case reflect.Map:
		return "a table of " + plural(t.Elem())
	case reflect.Struct:
		return "a table"
	}
	return t.String()
}

func plural(t reflect.Type) string {
	s := strings.TrimPrefix(strings.TrimPrefix(describe(t), "an "), "a ")
	s, _, _ = strings.Cut(s, " (")
	return s + "s"
}

func withArticle(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an " + noun
	}
	return "a " + noun
}
