package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValue(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" means not valid
	}{
		{`{}`, `{}`},
		{` {"a":1} `, `{"a":1}`},
		{"\t[1, 2 ,3]\r\n", `[1, 2 ,3]`},
		{`"x"`, `"x"`},
		{`"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"`, `"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"`},
		{`0`, `0`},
		{`-0.5e+10`, `-0.5e+10`},
		{`1E5`, `1E5`},
		{`true`, `true`},
		{`false`, `false`},
		{`null`, `null`},
		{`{"a":{"b":[{"c":[]},{}]},"d":"}"}`, `{"a":{"b":[{"c":[]},{}]},"d":"}"}`},
		{`[[[[]]]]`, `[[[[]]]]`},
		// Malformed.
		{``, ``},
		{`   `, ``},
		{`{`, ``},
		{`}`, ``},
		{`[1,]`, ``},
		{`[,1]`, ``},
		{`[1 2]`, ``},
		{`{"a"}`, ``},
		{`{"a":}`, ``},
		{`{"a":1,}`, ``},
		{`{a:1}`, ``},
		{`{"a" 1}`, ``},
		{`[}`, ``},
		{`{]`, ``},
		{`[1]]`, ``},
		{`"abc`, ``},
		{`"a\x"`, ``},
		{`"\u12"`, ``},
		{`"\u12G4"`, ``},
		{"\"a\nb\"", ``},
		{`01`, ``},
		{`-`, ``},
		{`1.`, ``},
		{`.5`, ``},
		{`1e`, ``},
		{`1e+`, ``},
		{`+1`, ``},
		{`tru`, ``},
		{`truex`, ``},
		{`nul`, ``},
		{`1 2`, ``},
		{`{"a":1} x`, ``},
		{`NaN`, ``},
	}
	for _, tt := range tests {
		v, ok := Value([]byte(tt.in))
		if ok != (tt.want != "") || string(v) != tt.want {
			t.Errorf("Value(%q) = %q, %v; want %q", tt.in, v, ok, tt.want)
		}
		if ok != json.Valid([]byte(tt.in)) {
			t.Errorf("Value(%q) ok = %v, encoding/json says %v", tt.in, ok, !ok)
		}
	}
}

func TestNext(t *testing.T) {
	v, rest, ok := Next([]byte(` 12 , "x"`))
	if !ok || string(v) != "12" || string(rest) != ` , "x"` {
		t.Fatalf("Next = %q, %q, %v", v, rest, ok)
	}
	if _, _, ok := Next([]byte(`  `)); ok {
		t.Fatal("Next on whitespace reported a value")
	}
}

func TestDepthLimit(t *testing.T) {
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, valid := Value([]byte(ok)); !valid {
		t.Errorf("nesting of exactly MaxDepth rejected")
	}
	deep := "[" + ok + "]"
	if _, valid := Value([]byte(deep)); valid {
		t.Errorf("nesting deeper than MaxDepth accepted")
	}
	// A very deep, unterminated input must fail quickly rather than recurse.
	if _, valid := Value(bytes.Repeat([]byte("{\"a\":"), 100000)); valid {
		t.Errorf("unterminated deep object accepted")
	}
}

func TestIter(t *testing.T) {
	in := []byte(`{"a": 1, "b\u0022" : [true, {"x":"y"}], "c":"s", "a": null}`)
	it := Object(in)
	var keys, vals []string
	for it.Next() {
		keys = append(keys, string(it.Key()))
		vals = append(vals, string(it.Value()))
	}
	if err := it.Err(); err != nil {
		t.Fatalf("Err = %v", err)
	}
	wantKeys := []string{"a", `b\u0022`, "c", "a"}
	wantVals := []string{"1", `[true, {"x":"y"}]`, `"s"`, "null"}
	if strings.Join(keys, "|") != strings.Join(wantKeys, "|") || strings.Join(vals, "|") != strings.Join(wantVals, "|") {
		t.Fatalf("got keys %q vals %q", keys, vals)
	}

	arr := Array([]byte(`[1, "two", [3]]`))
	n := 0
	for arr.Next() {
		if arr.Key() != nil {
			t.Errorf("array element has key %q", arr.Key())
		}
		n++
	}
	if n != 3 || arr.Err() != nil {
		t.Fatalf("array: %d elements, err %v", n, arr.Err())
	}

	for _, bad := range []string{`{"a":1,}`, `{"a":1 "b":2}`, `[1,2`, `{"a":1}}`, `[1]`, ``, `null`} {
		it := Object([]byte(bad))
		for it.Next() {
		}
		if !errors.Is(it.Err(), ErrSyntax) {
			t.Errorf("Object(%q).Err() = %v, want ErrSyntax", bad, it.Err())
		}
	}
	empty := Object([]byte(" {} "))
	if empty.Next() || empty.Err() != nil {
		t.Errorf("empty object: Next true or Err %v", empty.Err())
	}
	var zero Iter
	if zero.Next() || zero.Err() == nil {
		t.Errorf("zero Iter must yield nothing and report an error")
	}
}

func TestEnter(t *testing.T) {
	doc := []byte(`{"a":{"x":[1,{"y":"z"}],"w":2},"b":[[],[3]],"c":"end"}`)
	it := Object(doc)
	var got []string
	for it.Next() {
		switch {
		case it.KeyIs("a"):
			if it.Kind() != KindObject {
				t.Fatalf("Kind = %v", it.Kind())
			}
			a := it.Enter()
			for a.Next() {
				if a.KeyIs("x") {
					x := a.Enter()
					for x.Next() {
						got = append(got, "x:"+string(x.Value()))
					}
				} else {
					got = append(got, string(a.Key())+"="+string(a.Value()))
				}
			}
			if a.Err() != nil {
				t.Fatal(a.Err())
			}
		case it.KeyIs("b"):
			b := it.Enter()
			b.Next()
			inner := b.Enter() // left before its end: the parents must cope
			inner.Next()
		default:
			got = append(got, string(it.Key())+"="+string(it.Value()))
		}
	}
	if it.Err() != nil {
		t.Fatal(it.Err())
	}
	want := `x:1|x:{"y":"z"}|w=2|c="end"`
	if strings.Join(got, "|") != want {
		t.Fatalf("got %q, want %q", strings.Join(got, "|"), want)
	}

	// The parent resumes right after a fully walked child: the child's end
	// becomes the parent's value end.
	it = Object([]byte(`{"o":{"k":1} ,"n":2}`))
	it.Next()
	child := it.Enter()
	for child.Next() {
	}
	if string(it.Value()) != `{"k":1}` {
		t.Fatalf("value after child = %q", it.Value())
	}

	// Enter on a scalar, and a malformed child seen by the parent too.
	it = Object([]byte(`{"s":"x","m":{"k":tru}}`))
	it.Next()
	if e := it.Enter(); e.Next() || e.Err() == nil {
		t.Fatal("Enter on a string yielded values")
	}
	it.Next()
	m := it.Enter()
	for m.Next() {
		_ = m.Value()
	}
	if m.Err() == nil {
		t.Fatal("malformed child not reported")
	}
	for it.Next() {
	}
	if it.Err() == nil {
		t.Fatal("malformed child not reported by the parent")
	}

	// Lazy values: a malformed value after the current one is found later.
	it = Object([]byte(`{"a":1,"b":[}`))
	if !it.Next() || string(it.Value()) != "1" || !it.Next() || it.Value() != nil || it.Next() || it.Err() == nil {
		t.Fatal("malformed second value not reported")
	}
}

func TestEnterDepth(t *testing.T) {
	doc := []byte(strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth))
	it := Array(doc)
	levels := 1
	for it.Next() && it.Kind() == KindArray {
		child := it.Enter()
		it = child
		levels++
	}
	if levels != MaxDepth {
		t.Fatalf("entered %d levels, want %d", levels, MaxDepth)
	}
	deeper := []byte("[" + string(doc) + "]")
	it = Array(deeper)
	for it.Next() && it.Kind() == KindArray {
		it = it.Enter()
	}
	if it.Err() == nil {
		t.Fatal("nesting beyond MaxDepth accepted through Enter")
	}
}

func TestKeyIs(t *testing.T) {
	it := Object([]byte(`{"\u0074ype":1,"typ\u00e9":2,"t\"":3,"plain":4}`))
	var got []bool
	for it.Next() {
		got = append(got, it.KeyIs("type"), it.KeyIs("typé"), it.KeyIs(`t"`), it.KeyIs("plain"))
	}
	want := []bool{
		true, false, false, false,
		false, true, false, false,
		false, false, true, false,
		false, false, false, true,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d results", len(got))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestEqualAndUnescape(t *testing.T) {
	tests := []struct {
		raw, decoded string
	}{
		{``, ``},
		{`abc`, `abc`},
		{`a\nb`, "a\nb"},
		{`\u0000`, "\x00"},
		{`\u00e9t\u00E9`, "été"},
		{`\uD83D\uDE00`, "😀"},
		{`\uD83D`, "\uFFFD"},        // lone high surrogate
		{`\uDE00x`, "\uFFFDx"},      // lone low surrogate
		{`\uD83D\u0041`, "\uFFFDA"}, // high surrogate followed by a non-surrogate
		{`\/\\\"\b\f\r\t`, "/\\\"\b\f\r\t"},
	}
	for _, tt := range tests {
		if got := string(AppendUnescape(nil, []byte(tt.raw))); got != tt.decoded {
			t.Errorf("AppendUnescape(%q) = %q, want %q", tt.raw, got, tt.decoded)
		}
		if !Equal([]byte(tt.raw), tt.decoded) {
			t.Errorf("Equal(%q, %q) = false", tt.raw, tt.decoded)
		}
		if Equal([]byte(tt.raw), tt.decoded+"x") || (tt.decoded != "" && Equal([]byte(tt.raw), tt.decoded[:len(tt.decoded)-1])) {
			t.Errorf("Equal(%q) matched a different literal", tt.raw)
		}
		var ref string
		if err := json.Unmarshal([]byte(`"`+tt.raw+`"`), &ref); err != nil || ref != tt.decoded {
			t.Errorf("encoding/json decodes %q to %q (%v); test table wrong", tt.raw, ref, err)
		}
	}
	if Equal([]byte(`\x`), `\x`) {
		t.Error("malformed escape matched")
	}
}

func TestScalars(t *testing.T) {
	ints := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"19", 19, true},
		{"-7", -7, true},
		{"9223372036854775807", 1<<63 - 1, true},
		{"-9223372036854775808", -1 << 63, true},
		{"9223372036854775808", 0, false},
		{"99999999999999999999", 0, false},
		{"1.0", 0, false},
		{"1e3", 0, false},
		{"01", 0, false},
		{"-", 0, false},
		{"", 0, false},
		{`"1"`, 0, false},
		{"null", 0, false},
	}
	for _, tt := range ints {
		got, ok := Int([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("Int(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	strs := []struct {
		in       string
		nonEmpty bool
		contents string
		ok       bool
	}{
		{`""`, false, "", true},
		{`"a"`, true, "a", true},
		{`"\u0000"`, true, `\u0000`, true},
		{`"`, false, "", false},
		{`x`, false, "", false},
		{`null`, false, "", false},
		{``, false, "", false},
	}
	for _, tt := range strs {
		if got := NonEmptyString([]byte(tt.in)); got != tt.nonEmpty {
			t.Errorf("NonEmptyString(%q) = %v", tt.in, got)
		}
		s, ok := String([]byte(tt.in))
		if ok != tt.ok || string(s) != tt.contents {
			t.Errorf("String(%q) = %q, %v", tt.in, s, ok)
		}
	}
	kinds := map[string]Kind{"": KindInvalid, "x": KindInvalid, "null": KindNull, "true": KindBool, "false": KindBool,
		"-1": KindNumber, "3": KindNumber, `"s"`: KindString, "[]": KindArray, "{}": KindObject}
	for in, want := range kinds {
		if got := KindOf([]byte(in)); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestGet(t *testing.T) {
	obj := []byte(`{"usage":{"prompt_tokens":5},"usage":{"prompt_tokens":7},"x":[]}`)
	v, ok := Get(obj, "usage")
	if !ok || string(v) != `{"prompt_tokens":7}` {
		t.Fatalf("Get = %q, %v (last duplicate must win)", v, ok)
	}
	if _, ok := Get(obj, "missing"); ok {
		t.Error("Get found a missing key")
	}
	if _, ok := Get([]byte(`{"usage":1,`), "usage"); ok {
		t.Error("Get succeeded on a malformed object")
	}
}

func TestNoAllocs(t *testing.T) {
	doc := []byte(`{"id":"x","choices":[{"index":0,"delta":{"content":"Oslo \u00e9"}}],"usage":{"prompt_tokens":19,"completion_tokens":8}}`)
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := Value(doc); !ok {
			t.Fatal("invalid")
		}
		it := Object(doc)
		for it.Next() {
			if it.KeyIs("usage") {
				u, _ := Get(it.Value(), "prompt_tokens")
				if n, ok := Int(u); !ok || n != 19 {
					t.Fatal("prompt_tokens")
				}
			}
		}
		if !Equal([]byte(`\u0074ype`), "type") {
			t.Fatal("Equal")
		}
	})
	if allocs != 0 {
		t.Fatalf("allocs per run = %v, want 0", allocs)
	}
}

// FuzzJSONScan checks the scanner against encoding/json: the same inputs are
// valid, the same elements and members are found, strings decode to the same
// text and integers to the same numbers. Any input must be handled without a
// panic and in a bounded number of steps.
func FuzzJSONScan(f *testing.F) {
	seeds := []string{
		`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\u00e9\n"}}`,
		`{"error":{"message":"m","type":"server_error","param":null,"code":500}}`,
		`[1,-2.5e3,true,false,null,"\uD83D\uDE00",{},[]]`,
		`{"a":{"b":{"c":[[[{"d":0}]]]}}}`,
		`"\uD800\uDC00\uDBFF"`,
		`{"\u0074ype":"x"}`,
		`{"a":1,}`,
		`[1 2]`,
		`"\u12"`,
		`01`,
		`9223372036854775808`,
		`-9223372036854775808`,
		"\"\x00\"",
		"{\"a\":\"\xff\"}",
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, ok := Value(b)
		if bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) <= MaxDepth {
			if want := json.Valid(b); ok != want {
				t.Fatalf("Value ok = %v, encoding/json.Valid = %v", ok, want)
			}
		}
		// Whatever the input, the iterators terminate and never panic.
		for _, it := range []Iter{Object(b), Array(b)} {
			steps := 0
			for it.Next() {
				steps++
				if steps > len(b) {
					t.Fatal("iterator does not make progress")
				}
				_ = it.KeyIs("type")
			}
			_ = it.Err()
		}
		Next(b)
		Get(b, "a")
		Int(b)
		Equal(b, "type")
		AppendUnescape(nil, b)
		// Walking by position accepts exactly what Value accepts, and
		// sees the same structure.
		posOut, posOK := walkDoc(b)
		if posOK != ok {
			t.Fatalf("walk by position ok = %v, Value ok = %v", posOK, ok)
		}
		if ok {
			check(t, v, 0)
			if KindOf(v) == KindObject || KindOf(v) == KindArray {
				top := newIter(v, v[0])
				if got := walk(t, &top); !bytes.Equal(got, canonicalJSON(t, v)) {
					t.Fatalf("walk with Enter gives %q, want %q", got, canonicalJSON(t, v))
				}
			}
			if !bytes.Equal(posOut, canonicalJSON(t, v)) {
				t.Fatalf("walk by position gives %q, want %q", posOut, canonicalJSON(t, v))
			}
		}
	})
}

// walkDoc walks the document b by position (Member, Element, Skip),
// descending into every container, and rebuilds it in compact form.
func walkDoc(b []byte) ([]byte, bool) {
	i := SkipWS(b, 0)
	if i >= len(b) {
		return nil, false
	}
	var out []byte
	end, ok := walkPos(b, i, 0, &out)
	if !ok || SkipWS(b, end) != len(b) {
		return nil, false
	}
	return out, true
}

// walkPos appends the value at b[i], held at nesting depth, to out.
func walkPos(b []byte, i, depth int, out *[]byte) (int, bool) {
	c := b[i]
	if c != '{' && c != '[' {
		end, ok := Skip(b, i, depth)
		if ok {
			*out = append(*out, b[i:end]...)
		}
		return end, ok
	}
	if depth+1 > MaxDepth {
		return 0, false
	}
	*out = append(*out, c)
	i++
	for first := true; ; first = false {
		var (
			key        []byte
			v          int
			more, ok   bool
			_, isArray = c == '[', c == '['
		)
		if isArray {
			v, more, ok = Element(b, i, first)
		} else {
			key, _, v, more, ok = Member(b, i, first)
		}
		if !ok {
			return 0, false
		}
		if !more {
			*out = append(*out, b[v-1])
			return v, true
		}
		if !first {
			*out = append(*out, ',')
		}
		if !isArray {
			*out = append(append(append(*out, '"'), key...), '"', ':')
		}
		if i, ok = walkPos(b, v, depth+1, out); !ok {
			return 0, false
		}
	}
}

func TestWalkByPosition(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{}`, `{}`},
		{` { } `, `{}`},
		{`[]`, `[]`},
		{`[ ]`, `[]`},
		{`{"a":1,"b":[2,{"c":"d"}],"e":null}`, `{"a":1,"b":[2,{"c":"d"}],"e":null}`},
		{"{ \"a\" : 1 ,\n\t\"b\" : [ 2 , 3 ] }", `{"a":1,"b":[2,3]}`},
		{`{"\u0061":"x\n"}`, `{"\u0061":"x\n"}`},
		{`{,}`, ``},
		{`{"a":1,}`, ``},
		{`{"a" 1}`, ``},
		{`{"a":}`, ``},
		{`{"a":1 "b":2}`, ``},
		{`{"a":1]`, ``},
		{`[1,]`, ``},
		{`[,1]`, ``},
		{`[1 2]`, ``},
		{`[1}`, ``},
		{`{"a":1}x`, ``},
		{`{"a"`, ``},
	} {
		got, ok := walkDoc([]byte(tt.in))
		if ok != (tt.want != "") || string(got) != tt.want {
			t.Errorf("walkDoc(%q) = %q, %v; want %q", tt.in, got, ok, tt.want)
		}
	}
	key, esc, v, more, ok := Member([]byte(`{"t\u0079pe":"x"}`), 1, true)
	if !ok || !more || !esc || v != 13 || !KeyEq(key, esc, "type") || KeyEq(key, esc, "typ") {
		t.Errorf("Member on an escaped key = %q, %v, %d, %v, %v", key, esc, v, more, ok)
	}
	if _, ok := Skip([]byte(strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth)), 0, 1); ok {
		t.Error("Skip ignored the depth of the value's holder")
	}
}

// check walks a valid value and compares each part with encoding/json.
func check(t *testing.T, v []byte, depth int) {
	t.Helper()
	switch KindOf(v) {
	case KindString:
		s, ok := String(v)
		if !ok {
			t.Fatalf("String(%q) not ok", v)
		}
		checkString(t, s)
	case KindNumber:
		var want int64
		err := json.Unmarshal(v, &want)
		got, ok := Int(v)
		if ok != (err == nil) || got != want {
			t.Fatalf("Int(%q) = %d, %v; encoding/json: %d, %v", v, got, ok, want, err)
		}
	case KindArray:
		var ref []json.RawMessage
		if err := json.Unmarshal(v, &ref); err != nil {
			t.Fatalf("encoding/json rejects %q: %v", v, err)
		}
		it := Array(v)
		n := 0
		for it.Next() {
			if n >= len(ref) || !bytes.Equal(it.Value(), bytes.TrimSpace(ref[n])) {
				t.Fatalf("array element %d of %q: %q", n, v, it.Value())
			}
			check(t, it.Value(), depth+1)
			n++
		}
		if it.Err() != nil || n != len(ref) {
			t.Fatalf("array %q: %d elements, err %v; want %d", v, n, it.Err(), len(ref))
		}
	case KindObject:
		it := Object(v)
		for it.Next() {
			checkString(t, it.Key())
			check(t, it.Value(), depth+1)
		}
		if it.Err() != nil {
			t.Fatalf("object %q: %v", v, it.Err())
		}
	}
}

func checkString(t *testing.T, s []byte) {
	t.Helper()
	dec := AppendUnescape(nil, s)
	if !Equal(s, string(dec)) || Equal(s, string(dec)+"\x00") {
		t.Fatalf("Equal disagrees with AppendUnescape on %q", s)
	}
	if !utf8.Valid(s) {
		return // encoding/json would replace the invalid bytes
	}
	var ref string
	if err := json.Unmarshal(append(append([]byte{'"'}, s...), '"'), &ref); err != nil {
		t.Fatalf("encoding/json rejects string %q: %v", s, err)
	}
	if ref != string(dec) {
		t.Fatalf("AppendUnescape(%q) = %q, encoding/json %q", s, dec, ref)
	}
}

func BenchmarkObjectIter(b *testing.B) {
	doc := []byte(`{"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_tg01","service_tier":"default","choices":[{"index":0,"delta":{"content":" is the capital of Norway."},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Lk"}`)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		it := Object(doc)
		for it.Next() {
			_ = it.KeyIs("choices")
		}
		if it.Err() != nil {
			b.Fatal(it.Err())
		}
	}
}

// walk rebuilds a container from its iterator, descending with Enter, in the
// compact form encoding/json's Compact gives.
func walk(t *testing.T, it *Iter) []byte {
	t.Helper()
	open, closer := byte('['), byte(']')
	if it.obj {
		open, closer = '{', '}'
	}
	out := []byte{open}
	n := 0
	for it.Next() {
		if n > 0 {
			out = append(out, ',')
		}
		n++
		if it.obj {
			out = append(append(append(out, '"'), it.Key()...), '"', ':')
		}
		if k := it.Kind(); k == KindObject || k == KindArray {
			child := it.Enter()
			out = append(out, walk(t, &child)...)
			if child.Err() != nil {
				t.Fatalf("child of a valid value: %v", child.Err())
			}
		} else {
			out = append(out, it.Value()...)
		}
	}
	if it.Err() != nil {
		t.Fatalf("iterating a valid value: %v", it.Err())
	}
	return append(out, closer)
}

func canonicalJSON(t *testing.T, v []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, v); err != nil {
		t.Fatalf("encoding/json cannot compact a valid value: %v", err)
	}
	return buf.Bytes()
}

// TestAppendStringRoundTrips: what AppendString writes is one valid JSON
// string that decodes (with encoding/json and with AppendUnescape) to the
// input, invalid UTF-8 aside, which becomes U+FFFD as encoding/json makes it.
func TestAppendStringRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "new\nline\r\t", "\x00\x01\x1f\x7f", "<a&b>",
		"caf\u00e9 \u65e5\u672c", "line\u2028sep\u2029para", "emoji \U0001F600", "\xff\xfe bad", "trunc\xe2\x82"} {
		b := AppendString([]byte("prefix:"), s)
		q, ok := strings.CutPrefix(string(b), "prefix:")
		if !ok || !json.Valid([]byte(q)) {
			t.Errorf("AppendString(%q) = %s: not a JSON string after the prefix", s, b)
			continue
		}
		want := string([]rune(s)) // each invalid byte one U+FFFD, as encoding/json decodes it
		var got string
		if err := json.Unmarshal([]byte(q), &got); err != nil || got != want {
			t.Errorf("AppendString(%q) = %s decodes to %q (%v), want %q", s, q, got, err, want)
		}
		if u := AppendUnescape(nil, []byte(q[1:len(q)-1])); string(u) != want {
			t.Errorf("AppendUnescape(AppendString(%q)) = %q, want %q", s, u, want)
		}
	}
}
