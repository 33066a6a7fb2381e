package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of a container's memory limit the Go
// runtime's soft limit (GOMEMLIMIT) is set to when none is given: the rest
// is left for what the runtime does not count (thread stacks outside Go,
// the binary's pages) and for the page cache the access log writes through.
const memoryLimitShare = 0.9

// memoryLimit decides the Go runtime's soft memory limit for serve: none
// when GOMEMLIMIT is set (the runtime has read it) or when the process's
// cgroup sets no limit, else memoryLimitShare of that limit. With a soft
// limit the collector runs more often as the heap nears it, rather than
// letting a burst of streams grow the heap to twice its live size (GOGC's
// default) and the container be killed for memory. root is the cgroup
// filesystem, /sys/fs/cgroup; source says which file gave the limit.
func memoryLimit(getenv func(string) string, root string) (limit int64, source string) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, ""
	}
	for _, f := range []string{
		"memory.max",                   // cgroup v2, the process's own group as seen from inside a container
		"memory/memory.limit_in_bytes", // cgroup v1
		"unified/memory.max",           // hybrid hierarchy
	} {
		p := filepath.Join(root, f)
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(s, 10, 64)
		// "max" (v2) or a page-rounded MaxInt64 (v1) mean no limit.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, ""
		}
		return int64(float64(n) * memoryLimitShare), p
	}
	return 0, ""
}
