// Package procstat reads a process's memory and CPU from Linux's /proc, for
// the side-by-side benchmark and the tests that measure the gateway as a
// process of its own. A field it cannot read counts as 0.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// StatusKiB is a field of /proc/<pid>/status given in kB (VmRSS, VmHWM).
func StatusKiB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// Linux).
const clockTicks = 100

// CPUSeconds is pid's user and system CPU time so far.
func CPUSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces and
	// parentheses) start at field 3; utime and stime are fields 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(u+st) / clockTicks
}
