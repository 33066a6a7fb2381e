package ratelimit

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// clusterPrefix returns a key prefix under which the subjects' hash tags
// are served by one master (same) or each by another (!same), so that a
// test chooses whether a request spans masters.
func clusterPrefix(t *testing.T, c *redistest.Cluster, same bool, subjects ...Subject) string {
	t.Helper()
	for i := range 100 {
		prefix := "c" + strconv.Itoa(i) + ":rl:"
		r := NewRedis(nil, RedisOptions{Prefix: prefix})
		masters := map[string]bool{}
		for _, s := range subjects {
			masters[c.MasterOf(r.keys(s).base)] = true
		}
		if same && len(masters) == 1 || !same && len(masters) == len(subjects) {
			return prefix
		}
	}
	t.Fatalf("no prefix of 100 puts %d subjects on the masters wanted (same: %v)", len(subjects), same)
	return ""
}

// TestClusterFailoverUndoesTimedOutAdmission is
// TestFailoverUndoesTimedOutAdmission through a ClusterClient, whose
// subjects share a master that a script keeps busy. A ClusterClient sends a
// timed-out command again (up to MaxRedirects times, whatever MaxRetries
// says): the busy master would then run the admission several times, and
// the undo of its lease take back one of them.
func TestClusterFailoverUndoesTimedOutAdmission(t *testing.T) {
	c := redistest.StartCluster(t)
	prefix := clusterPrefix(t, c, true, keySubject("slow", Limits{}), teamSubject("slow", Limits{}))
	client := c.ClientWith(t, redis.ClusterOptions{ReadTimeout: 100 * time.Millisecond})
	busy := c.Node(c.MasterOf("{" + prefix + "key:slow}"))
	undoesTimedOutAdmission(t, client, prefix, busy)
}
