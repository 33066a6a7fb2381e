package procstat

import (
	"os"
	"testing"
	"time"
)

// TestReadsThisProcess: this process has a resident size, a peak at least
// as large, and CPU time that grows while it works; a process that does
// not exist reads as 0.
func TestReadsThisProcess(t *testing.T) {
	pid := os.Getpid()
	rss, hwm := StatusKiB(pid, "VmRSS"), StatusKiB(pid, "VmHWM")
	if rss <= 0 || hwm < rss {
		t.Errorf("VmRSS %d kB, VmHWM %d kB: want a positive RSS and a peak at least as large", rss, hwm)
	}
	before := CPUSeconds(pid)
	x := 0
	for deadline := time.Now().Add(5 * time.Second); CPUSeconds(pid) <= before && time.Now().Before(deadline); {
		for i := range 1_000_000 {
			x += i
		}
	}
	if CPUSeconds(pid) <= before {
		t.Errorf("CPU time stayed at %.2f s after up to 5 s of work (%d)", before, x)
	}
	if StatusKiB(1<<30, "VmRSS") != 0 || CPUSeconds(1<<30) != 0 {
		t.Error("a process that does not exist read as more than 0")
	}
}
