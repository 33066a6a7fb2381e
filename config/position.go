package config

import (
	"regexp"
	"strconv"

	"github.com/pelletier/go-toml/v2/unstable"
)

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
