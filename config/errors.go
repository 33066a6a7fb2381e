package config

import (
	"errors"
	"iter"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
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

// docIndex knows, for a TOML document, the line of every key path and of
// every array-table header. It gives validation errors a line and decoding
// errors their array indexes.
type docIndex struct {
	lines     map[string]int   // "upstreams[0].base_url" → line
	arrays    map[string][]int // "upstreams" → line of each [[upstreams]] header
	syntaxErr bool             // the document is not valid TOML
}

// indexDoc parses data. It never fails: on a syntax error it indexes what
// came before and records that the document is invalid.
func indexDoc(data []byte) *docIndex {
	idx := &docIndex{lines: map[string]int{}, arrays: map[string][]int{}}
	var p unstable.Parser
	p.Reset(data)
	prefix := ""
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts, line := keyParts(&p, e)
			path := idx.resolve(parts, line, true)
			if e.Kind == unstable.ArrayTable {
				n := len(idx.arrays[path])
				idx.arrays[path] = append(idx.arrays[path], line)
				path += "[" + strconv.Itoa(n) + "]"
			}
			idx.set(path, line)
			prefix = path
		case unstable.KeyValue:
			idx.addKeyValue(&p, prefix, e)
		}
	}
	idx.syntaxErr = p.Error() != nil
	return idx
}

// keyParts returns the parts of a node's key and the line it starts on.
func keyParts(p *unstable.Parser, n *unstable.Node) ([]string, int) {
	var parts []string
	line := 0
	it := n.Key()
	for it.Next() {
		k := it.Node()
		if line == 0 {
			line = p.Shape(k.Raw).Start.Line
		}
		parts = append(parts, string(k.Data))
	}
	return parts, line
}

func (idx *docIndex) addKeyValue(p *unstable.Parser, prefix string, kv *unstable.Node) {
	parts, line := keyParts(p, kv)
	path := prefix
	for _, part := range parts {
		path = joinKey(path, part)
		idx.set(path, line)
	}
	v := kv.Value()
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if c := it.Node(); c.Kind == unstable.KeyValue {
				idx.addKeyValue(p, path, c)
			}
		}
	case unstable.Array:
		it := v.Children()
		for i := 0; it.Next(); i++ {
			elem := path + "[" + strconv.Itoa(i) + "]"
			idx.set(elem, line)
			if c := it.Node(); c.Kind == unstable.InlineTable {
				ct := c.Children()
				for ct.Next() {
					if kv := ct.Node(); kv.Kind == unstable.KeyValue {
						idx.addKeyValue(p, elem, kv)
					}
				}
			}
		}
	}
}

// set records the first line that mentions path.
func (idx *docIndex) set(path string, line int) {
	if _, ok := idx.lines[path]; !ok {
		idx.lines[path] = line
	}
}

// resolve joins key parts into a path, putting in each array table the index
// of the element being written at line: the last header at or before it.
// The last part gets no index when header is true (it names the table).
func (idx *docIndex) resolve(parts []string, line int, header bool) string {
	path := ""
	for j, part := range parts {
		path = joinKey(path, part)
		if header && j == len(parts)-1 {
			break
		}
		n := 0
		for _, l := range idx.arrays[path] {
			if l <= line {
				n++
			}
		}
		if n > 0 {
			path += "[" + strconv.Itoa(n-1) + "]"
		}
	}
	return path
}

// keyPath renders a key reported by go-toml at line as a path with array
// indexes, e.g. ["upstreams", "base_ur"] → "upstreams[1].base_ur".
func (idx *docIndex) keyPath(key []string, line int) string {
	return idx.resolve(key, line, true)
}

// line returns the line of path, or of its nearest parent that the document
// sets; 0 when there is none.
func (idx *docIndex) line(path string) int {
	for path != "" {
		if l, ok := idx.lines[path]; ok {
			return l
		}
		path = parentKey(path)
	}
	return 0
}

// parentKey drops the last part (".name" or "[i]") of a key path.
func parentKey(path string) string {
	cut, quoted := 0, false
	for i := 0; i < len(path); i++ {
		switch c := path[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case (c == '.' || c == '[') && !quoted:
			cut = i
		}
	}
	return path[:cut]
}

var bareKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// joinKey appends one key part to path, quoting it when TOML would.
func joinKey(path, part string) string {
	if !bareKeyRE.MatchString(part) {
		part = strconv.Quote(part)
	}
	if path == "" {
		return part
	}
	return path + "." + part
}
