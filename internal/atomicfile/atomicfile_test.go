package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// leftovers lists the files in dir other than the names given.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
outer:
	for _, e := range ents {
		for _, k := range keep {
			if e.Name() == k {
				continue outer
			}
		}
		extra = append(extra, e.Name())
	}
	return extra
}

func TestWriteCreatesAndReplaces(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "state.json")
	for _, data := range []string{`{"v":1}`, `{"v":2,"longer":true}`, `{}`} {
		if err := Write(name, []byte(data)); err != nil {
			t.Fatalf("Write(%s): %v", data, err)
		}
		got, err := os.ReadFile(name)
		if err != nil || string(got) != data {
			t.Fatalf("file holds %q (%v), want %q", got, err, data)
		}
		fi, err := os.Stat(name)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v (%v), want 0600", fi.Mode().Perm(), err)
		}
		if extra := leftovers(t, dir, "state.json"); len(extra) != 0 {
			t.Fatalf("temporary files left: %v", extra)
		}
	}
}

// TestWriteFailureLeavesOldFile: a rename that fails (the target is a
// directory) leaves what was there and no temporary file.
func TestWriteFailureLeavesOldFile(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "taken")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "inside"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("new")); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	if got, err := os.ReadFile(filepath.Join(target, "inside")); err != nil || string(got) != "old" {
		t.Fatalf("the old contents are %q (%v)", got, err)
	}
	if extra := leftovers(t, dir, "taken"); len(extra) != 0 {
		t.Fatalf("temporary files left: %v", extra)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Fatal("Write into a missing directory succeeded")
	}
}

func TestDecodeJSON(t *testing.T) {
	type doc struct {
		A int    `json:"a"`
		B string `json:"b"`
	}
	cases := []struct {
		in      string
		want    doc
		wantErr string
	}{
		{`{"a":1,"b":"x"}`, doc{1, "x"}, ""},
		{" {\"a\":2}\n\t ", doc{A: 2}, ""},
		{`{"a":1,"c":3}`, doc{}, "unknown field"},
		{`{"a":1}{"a":2}`, doc{}, "data after"},
		{`{"a":1} x`, doc{}, "data after"},
		{`{"a":1`, doc{}, "EOF"},
		{``, doc{}, "EOF"},
		{`{"a":"one"}`, doc{}, "cannot unmarshal"},
	}
	for _, c := range cases {
		var got doc
		err := DecodeJSON([]byte(c.in), &got)
		if c.wantErr == "" {
			if err != nil || got != c.want {
				t.Errorf("DecodeJSON(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			}
		} else if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("DecodeJSON(%q) error %v, want one containing %q", c.in, err, c.wantErr)
		}
	}
}

// TestReadJSON: a missing file is not found and no error; a strict document
// is read; a corrupt one is an error naming the package, the file's role
// and its path.
func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	var v struct{ A int }
	if found, err := ReadJSON("pkg", "state file", filepath.Join(dir, "none.json"), &v); found || err != nil {
		t.Fatalf("missing file: found %v, err %v", found, err)
	}
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	if err := Write(good, []byte(`{"A":7}`)); err != nil {
		t.Fatal(err)
	}
	if err := Write(bad, []byte(`{"A":7,"B":1}`)); err != nil {
		t.Fatal(err)
	}
	if found, err := ReadJSON("pkg", "state file", good, &v); !found || err != nil || v.A != 7 {
		t.Fatalf("good file: found %v, err %v, value %+v", found, err, v)
	}
	_, err := ReadJSON("pkg", "state file", bad, &v)
	if err == nil || !strings.HasPrefix(err.Error(), "pkg: state file "+bad+" is corrupt: ") {
		t.Fatalf("corrupt file: %v", err)
	}
}
