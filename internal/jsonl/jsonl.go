// Package jsonl appends to and reads the JSON-lines journals tollgate keeps
// (the owners of stored responses, the spend journal): one record a line,
// each appended with a single write to a file opened with O_APPEND, so that
// a process that dies keeps every line whose write returned (the kernel
// holds it), and read back tolerating the one trace such a death or a
// crash of the machine leaves: a torn last line.
package jsonl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// AppendString appends s as a JSON string. Only the quote, the backslash
// and control characters are escaped; other bytes are written as they are,
// so invalid UTF-8 reads back as U+FFFD, as encoding/json writes it.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// Append writes line, which ends in a newline, to f, a journal holding size
// bytes and opened with O_APPEND, with one write. A write that fails after
// writing part of the line cuts f back to size; whole is false when that
// failed too and f may end in a torn line, after which nothing should be
// appended to it (a line after it would make it a corrupt middle line).
func Append(f *os.File, size int64, line []byte) (whole bool, err error) {
	n, err := f.Write(line)
	if err == nil {
		return true, nil
	}
	if n > 0 {
		if terr := f.Truncate(size); terr != nil {
			return false, err
		}
	}
	return true, err
}

// Torn describes a last line that was ignored.
type Torn struct {
	Line  int   // its number, from 1
	Bytes int   // its length, newline included
	Err   error // why it does not decode; nil when it has no newline
}

// Result is what Read found in a journal.
type Result struct {
	// Lines is the number of lines parse accepted.
	Lines int
	// Size is the length of those lines: where a torn last line starts, to
	// cut it off before appending.
	Size int64
	// Exists reports whether the file was there.
	Exists bool
	// Torn is the ignored last line, if any.
	Torn *Torn
}

// CorruptError is a journal line, other than the last, that parse refused
// (or a line longer than the reader allows).
type CorruptError struct {
	File string
	Line int
	Err  error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("journal %s is corrupt: line %d: %v", e.File, e.Line, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Read reads the journal name and hands each complete line, newline
// included, to parse, which must not keep it. A missing file is an empty
// journal. A torn last line, the trace of a death in the middle of a write
// (no trailing newline, or a last line parse refuses), is not handed on and
// is reported in Result.Torn; a line parse refuses that is not the last is a
// *CorruptError naming the file and the line, so that a damaged journal is
// never silently half-read. maxLine bounds a line's length (a longer line
// is corrupt even when it is the last); 0 means no bound.
func Read(name string, maxLine int, parse func(line []byte) error) (Result, error) {
	var res Result
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("opening journal %s: %w", name, err)
	}
	defer f.Close()
	res.Exists = true
	size := maxLine
	if size <= 0 {
		size = 64 << 10
	}
	r := bufio.NewReaderSize(f, size)
	var long []byte // a line longer than r's buffer, when maxLine is 0
	for n := 1; ; n++ {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) && maxLine <= 0 {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		switch {
		case err == io.EOF:
			if len(line) > 0 {
				res.Torn = &Torn{Line: n, Bytes: len(line)}
			}
			return res, nil
		case errors.Is(err, bufio.ErrBufferFull):
			return res, &CorruptError{File: name, Line: n, Err: fmt.Errorf("longer than %d bytes", maxLine)}
		case err != nil:
			return res, fmt.Errorf("reading journal %s: %w", name, err)
		}
		if perr := parse(line); perr != nil {
			bytesLen := len(line)
			// line is not used past here: Peek may overwrite it.
			if _, err := r.Peek(1); err == io.EOF {
				res.Torn = &Torn{Line: n, Bytes: bytesLen, Err: perr}
				return res, nil
			}
			return res, &CorruptError{File: name, Line: n, Err: perr}
		}
		res.Lines++
		res.Size += int64(len(line))
	}
}
