package ownership

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStoreBehaviours runs every behaviour against every store: Local with
// a journal, Local in memory, and Redis on a real redis-server.
func TestStoreBehaviours(t *testing.T) {
	for _, sc := range storeCases {
		for _, b := range storeBehaviours {
			t.Run(sc.name+"/"+b.name, func(t *testing.T) {
				s := sc.make(t)
				b.run(t, s)
			})
		}
	}
}

// storeBehaviours are what every Store must do, each run on a fresh one.
var storeBehaviours = []struct {
	name string
	run  func(t *testing.T, s *subject)
}{
	{"claim then owner", func(t *testing.T, s *subject) {
		claim(t, s, "resp_1", "team:a", time.Hour)
		wantOwner(t, s, "resp_1", "team:a")
		wantOwner(t, s, "resp_2", "")
	}},
	{"second owner's claim returns the first and changes nothing", func(t *testing.T, s *subject) {
		claim(t, s, "resp_1", "team:a", time.Hour)
		got, err := s.Claim(context.Background(), "resp_1", "team:b", 10*time.Hour)
		if err != nil || got != "team:a" {
			t.Fatalf("Claim by team:b = %q, %v; want team:a", got, err)
		}
		wantOwner(t, s, "resp_1", "team:a")
		if left, exp := s.remaining(t, "resp_1"); !exp || left > time.Hour {
			t.Fatalf("after team:b's claim, ttl left %v (expires %v), want at most 1h", left, exp)
		}
		// Nor does a claim without ttl make the record permanent.
		if got, err := s.Claim(context.Background(), "resp_1", "team:b", 0); err != nil || got != "team:a" {
			t.Fatalf("Claim by team:b without ttl = %q, %v; want team:a", got, err)
		}
		if _, exp := s.remaining(t, "resp_1"); !exp {
			t.Fatal("team:b's claim without ttl removed team:a's expiry")
		}
	}},
	{"same owner's claim renews the ttl", func(t *testing.T, s *subject) {
		claim(t, s, "resp_1", "team:a", time.Minute)
		claim(t, s, "resp_1", "team:a", time.Hour)
		if left, exp := s.remaining(t, "resp_1"); !exp || left <= time.Minute || left > time.Hour {
			t.Fatalf("after renewing for 1h, ttl left %v (expires %v)", left, exp)
		}
		claim(t, s, "resp_1", "team:a", 0)
		if left, exp := s.remaining(t, "resp_1"); exp {
			t.Fatalf("after renewing without ttl, ttl left %v, want no expiry", left)
		}
		claim(t, s, "resp_1", "team:a", time.Minute)
		if left, exp := s.remaining(t, "resp_1"); !exp || left > time.Minute {
			t.Fatalf("after renewing for 1m, ttl left %v (expires %v)", left, exp)
		}
	}},
	{"expired record is gone and can be claimed by another", func(t *testing.T, s *subject) {
		claim(t, s, "resp_1", "team:a", s.shortTTL)
		s.lapse(t, "resp_1")
		wantOwner(t, s, "resp_1", "")
		claim(t, s, "resp_1", "team:b", time.Hour)
		wantOwner(t, s, "resp_1", "team:b")
	}},
	{"ttl of zero or less never expires", func(t *testing.T, s *subject) {
		claim(t, s, "resp_zero", "team:a", 0)
		claim(t, s, "resp_neg", "team:a", -time.Second)
		claim(t, s, "resp_short", "team:a", s.shortTTL)
		s.lapse(t, "resp_short")
		wantOwner(t, s, "resp_short", "")
		for _, id := range []string{"resp_zero", "resp_neg"} {
			wantOwner(t, s, id, "team:a")
			if left, exp := s.remaining(t, id); exp {
				t.Fatalf("%s: ttl left %v, want no expiry", id, left)
			}
		}
	}},
	{"release by the wrong owner keeps the record, by the owner removes it", func(t *testing.T, s *subject) {
		claim(t, s, "conv_1", "team:a", time.Hour)
		if err := s.Release(context.Background(), "conv_1", "team:b"); err != nil {
			t.Fatal(err)
		}
		wantOwner(t, s, "conv_1", "team:a")
		if err := s.Release(context.Background(), "conv_1", "team:a"); err != nil {
			t.Fatal(err)
		}
		wantOwner(t, s, "conv_1", "")
		claim(t, s, "conv_1", "team:b", time.Hour)
		if err := s.Release(context.Background(), "conv_never", "team:a"); err != nil {
			t.Fatalf("Release of an id never claimed: %v", err)
		}
	}},
	{"bad ids and owners are errors and record nothing", func(t *testing.T, s *subject) {
		bad := map[string]string{
			"empty":          "",
			"513 bytes":      strings.Repeat("x", MaxLen+1),
			"NUL":            "resp_\x00",
			"newline":        "resp_1\n",
			"unit separator": "a\x1fb",
			"DEL":            "resp\x7f",
			"invalid UTF-8":  "resp_\xff",
		}
		for name, v := range bad {
			checks := map[string]error{}
			_, checks["Claim id"] = s.Claim(context.Background(), v, "team:a", time.Hour)
			_, checks["Claim owner"] = s.Claim(context.Background(), "resp_1", v, time.Hour)
			_, checks["Owner id"] = s.Owner(context.Background(), v)
			checks["Release id"] = s.Release(context.Background(), v, "team:a")
			checks["Release owner"] = s.Release(context.Background(), "resp_1", v)
			for call, err := range checks {
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("%s with %s: error %v, want ErrInvalid", call, name, err)
				}
			}
		}
		wantOwner(t, s, "resp_1", "")
		long := strings.Repeat("é", MaxLen/2) // 512 bytes: the longest allowed
		claim(t, s, long, long, time.Hour)
		wantOwner(t, s, long, long)
	}},
	{"odd but valid ids and owners come back as given", func(t *testing.T, s *subject) {
		for i, v := range []string{`a"b`, `back\slash`, "{tag}", "sp ace", "\u2028\u2029", "名前", "é\u0080"} {
			claim(t, s, v, v+strconv.Itoa(i), 0)
			wantOwner(t, s, v, v+strconv.Itoa(i))
		}
	}},
	{"concurrent claims of one id have exactly one winner", func(t *testing.T, s *subject) {
		const claimers = 32
		for round := range 10 {
			id := "resp_race_" + strconv.Itoa(round)
			holders := make([]string, claimers)
			errs := make([]error, claimers)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range claimers {
				wg.Go(func() {
					<-start
					holders[i], errs[i] = s.Claim(context.Background(), id, "team:"+strconv.Itoa(i), time.Hour)
				})
			}
			close(start)
			wg.Wait()
			wins := 0
			for i := range claimers {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				if holders[i] == "team:"+strconv.Itoa(i) {
					wins++
				}
				if holders[i] != holders[0] {
					t.Fatalf("round %d: claimer %d was told %q, claimer 0 %q", round, i, holders[i], holders[0])
				}
			}
			if wins != 1 {
				t.Fatalf("round %d: %d claims took, want 1", round, wins)
			}
			wantOwner(t, s, id, holders[0])
		}
	}},
}
