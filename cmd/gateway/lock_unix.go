//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// fileLock is an exclusive advisory lock (flock) on a file, held while a
// gateway uses the spend state file or the spill directory, so that two
// gateways can never overwrite each other's files.
type fileLock struct{ f *os.File }

// lockFile takes the lock on path (creating it), or says who holds it.
func lockFile(path, what string) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", what, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by another running gateway (%s is locked): give each replica its own", what, path)
		}
		return nil, fmt.Errorf("locking %s: %w", what, err)
	}
	return &fileLock{f: f}, nil
}

// Unlock releases the lock (closing the file releases a flock).
func (l *fileLock) Unlock() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}
