// Package atomicfile writes files that a crash leaves whole, and reads back
// the strict JSON documents tollgate keeps in them (the spend state file and
// the spill files).
package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces name with data so that a crash leaves either the old or the
// new file, never a torn one: a temporary file in the same directory is
// written and synced, renamed over name, and the directory synced so the
// rename itself is durable. The file has mode 0600 (os.CreateTemp's): these
// files say who spent what. On error no temporary file is left behind.
func Write(name string, data []byte) (err error) {
	dir := filepath.Dir(name)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), name); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadJSON reads the file name strictly into v (DecodeJSON). A missing file
// is found == false with no error. Errors name the file as what says, after
// the caller's package: "<pkg>: reading <what> <name>: ..." and
// "<pkg>: <what> <name> is corrupt: ...".
func ReadJSON(pkg, what, name string, v any) (found bool, err error) {
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: reading %s %s: %w", pkg, what, name, err)
	}
	if err := DecodeJSON(data, v); err != nil {
		return false, fmt.Errorf("%s: %s %s is corrupt: %w", pkg, what, name, err)
	}
	return true, nil
}

// DecodeJSON decodes one JSON document into v, refusing unknown fields and
// data after the document: a file that is not exactly what this version
// wrote is an error, never silently half-read.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON document")
	}
	return nil
}
