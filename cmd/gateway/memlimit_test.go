package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMemoryLimitFollowsTheContainer: the soft limit is 90% of a cgroup v2
// or v1 limit, none for an unlimited group or without cgroup files, and
// GOMEMLIMIT set by the operator always wins.
func TestMemoryLimitFollowsTheContainer(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMEMLIMIT" {
				return v
			}
			return ""
		}
	}
	cases := []struct {
		name, file, content, gomemlimit string
		want                            int64
	}{
		{"v2 limit", "memory.max", "1073741824\n", "", 966367641},
		{"v2 unlimited", "memory.max", "max\n", "", 0},
		{"v1 limit", "memory/memory.limit_in_bytes", "536870912\n", "", 483183820},
		{"v1 unlimited", "memory/memory.limit_in_bytes", "9223372036854771712\n", "", 0},
		{"hybrid", "unified/memory.max", "2147483648", "", 1932735283},
		{"GOMEMLIMIT set", "memory.max", "1073741824\n", "800MiB", 0},
		{"garbage", "memory.max", "lots\n", "", 0},
		{"no cgroup files", "", "", "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if c.file != "" {
				p := filepath.Join(root, c.file)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(c.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, source := memoryLimit(env(c.gomemlimit), root)
			if got != c.want {
				t.Errorf("limit %d, want %d", got, c.want)
			}
			if (got > 0) != (source == filepath.Join(root, c.file)) {
				t.Errorf("limit %d from %q", got, source)
			}
		})
	}
}
