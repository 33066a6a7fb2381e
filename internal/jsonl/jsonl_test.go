package jsonl

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// parseInts accepts lines holding one JSON number and collects them.
func parseInts(got *[]int) func([]byte) error {
	return func(line []byte) error {
		var n int
		if err := json.Unmarshal(line, &n); err != nil {
			return err
		}
		*got = append(*got, n)
		return nil
	}
}

func writeJournal(t *testing.T, data string) string {
	t.Helper()
	name := filepath.Join(t.TempDir(), "j.jsonl")
	if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestReadTornLastLineIsIgnored(t *testing.T) {
	for name, c := range map[string]struct {
		data      string
		want      []int
		size      int64
		tornLine  int
		tornBytes int
		tornErr   bool
	}{
		"whole":                {data: "1\n2\n", want: []int{1, 2}, size: 4},
		"empty":                {data: "", size: 0},
		"no trailing newline":  {data: "1\n2\n3", want: []int{1, 2}, size: 4, tornLine: 3, tornBytes: 1},
		"last line undecoded":  {data: "1\n2\n{x\n", want: []int{1, 2}, size: 4, tornLine: 3, tornBytes: 3, tornErr: true},
		"NUL bytes at the end": {data: "1\n\x00\x00\x00", want: []int{1}, size: 2, tornLine: 2, tornBytes: 3},
	} {
		t.Run(name, func(t *testing.T) {
			var got []int
			res, err := Read(writeJournal(t, c.data), 0, parseInts(&got))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) || res.Lines != len(c.want) || res.Size != c.size || !res.Exists {
				t.Fatalf("read %v, %+v; want %v, size %d", got, res, c.want, c.size)
			}
			switch {
			case c.tornLine == 0 && res.Torn != nil:
				t.Fatalf("torn %+v, want none", *res.Torn)
			case c.tornLine != 0 && (res.Torn == nil || res.Torn.Line != c.tornLine ||
				res.Torn.Bytes != c.tornBytes || (res.Torn.Err != nil) != c.tornErr):
				t.Fatalf("torn %+v, want line %d of %d bytes (error: %v)", res.Torn, c.tornLine, c.tornBytes, c.tornErr)
			}
		})
	}
}

func TestReadCorruptMiddleLineNamesFileAndLine(t *testing.T) {
	name := writeJournal(t, "1\n2\n{x\n4\n")
	var got []int
	_, err := Read(name, 0, parseInts(&got))
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Line != 3 || ce.File != name || !strings.Contains(err.Error(), name+" is corrupt: line 3") {
		t.Fatalf("error %v, want a *CorruptError for line 3 of %s", err, name)
	}
}

func TestReadMissingFileIsEmpty(t *testing.T) {
	res, err := Read(filepath.Join(t.TempDir(), "none"), 0, func([]byte) error { return errors.New("called") })
	if err != nil || res != (Result{}) {
		t.Fatalf("missing file: %+v, %v", res, err)
	}
}

// TestReadLongLines: without a bound a line of any length is read whole;
// with one, a longer line is corrupt even when it is the last.
func TestReadLongLines(t *testing.T) {
	long := `"` + strings.Repeat("x", 200<<10) + `"` + "\n"
	name := writeJournal(t, `"a"`+"\n"+long+`"b"`+"\n")
	var got []string
	res, err := Read(name, 0, func(line []byte) error {
		var s string
		if err := json.Unmarshal(line, &s); err != nil {
			return err
		}
		got = append(got, s)
		return nil
	})
	if err != nil || len(got) != 3 || len(got[1]) != 200<<10 || got[2] != "b" || res.Size != int64(8+len(long)) {
		t.Fatalf("unbounded: %d lines, %+v, %v", len(got), res, err)
	}
	_, err = Read(writeJournal(t, `"a"`+"\n"+long), 1024, func([]byte) error { return nil })
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Line != 2 {
		t.Fatalf("bounded: %v, want line 2 corrupt", err)
	}
}

// TestAppendFailureLeavesTheFileWhole: a write that fails (a read-only
// descriptor) reports a whole file, and the next line goes after the last
// good one.
func TestAppendFailureLeavesTheFileWhole(t *testing.T) {
	name := writeJournal(t, "1\n")
	ro, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if whole, err := Append(ro, 2, []byte("2\n")); err == nil || !whole {
		t.Fatalf("append to a read-only file: whole %v, %v", whole, err)
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if whole, err := Append(f, 2, []byte("3\n")); err != nil || !whole {
		t.Fatalf("append: whole %v, %v", whole, err)
	}
	var got []int
	if _, err := Read(name, 0, parseInts(&got)); err != nil || !reflect.DeepEqual(got, []int{1, 3}) {
		t.Fatalf("read back %v, %v", got, err)
	}
}

// FuzzAppendString: any valid UTF-8 string comes back from encoding/json
// as it was; any other string as encoding/json would have written it; the
// result never holds a raw newline (it must fit on one journal line).
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "team:a", `a"b\c`, "\n\r\t\x00\x1f", "\u2028名前", "\xff\xfe", "model\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := AppendString(nil, s)
		if strings.ContainsAny(string(b), "\n\r") {
			t.Fatalf("AppendString(%q) = %s holds a line break", s, b)
		}
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("AppendString(%q) = %s does not decode: %v", s, b, err)
		}
		want := s
		if !utf8.ValidString(s) {
			w, _ := json.Marshal(s)
			_ = json.Unmarshal(w, &want)
		}
		if got != want {
			t.Fatalf("AppendString(%q) decodes to %q, want %q", s, got, want)
		}
	})
}
