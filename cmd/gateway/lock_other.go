//go:build !unix

package main

// fileLock does nothing where flock is not available; each replica must
// still be given its own state file and spill directory.
type fileLock struct{}

func lockFile(path, what string) (*fileLock, error) { return &fileLock{}, nil }

// Unlock does nothing.
func (l *fileLock) Unlock() error { return nil }
