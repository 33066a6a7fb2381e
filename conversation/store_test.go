package conversation

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestTurnsFoldIntoTheirConversation(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("team:research", "conv-1")
		var want Conversation
		for i := int64(1); i <= 3; i++ {
			tu := s.turn(k, 10*i)
			tu.Error = i == 2
			s.Record(tu)
			want.add(&tu)
			s.clock.Advance(time.Second)
		}
		s.Record(s.turn(Key("team:research", "other"), 1))
		s.tick(ctx)
		got := s.get(t, k)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("conversation =\n%+v\nwant\n%+v", got, want)
		}
		if got.Turns != 3 || got.Errors != 1 || got.CostMicros != 60 || got.Tokens.Output != 120 ||
			got.Duration() != 2*time.Second || len(got.TTFTs) != 3 || got.TTFTs[2] != 30*time.Millisecond {
			t.Errorf("figures: %+v", got)
		}
		if c, err := s.Cost(ctx, k); err != nil || c != 60 {
			t.Errorf("Cost = %d, %v; want 60", c, err)
		}
		if c, err := s.Cost(ctx, Key("", "never")); err != nil || c != 0 {
			t.Errorf("Cost of an unknown conversation = %d, %v; want 0", c, err)
		}
		if _, err := s.Get(ctx, Key("", "never")); !errors.Is(err, ErrUnknown) {
			t.Errorf("Get of an unknown conversation: %v, want ErrUnknown", err)
		}
	})
}

func TestKeepsTheFirstTTFTsOnly(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		k := Key("", "long")
		for i := int64(1); i <= MaxTTFTs+5; i++ {
			s.Record(s.turn(k, i))
		}
		s.tick(context.Background())
		got := s.get(t, k)
		if got.Turns != MaxTTFTs+5 || len(got.TTFTs) != MaxTTFTs || got.TTFTs[MaxTTFTs-1] != MaxTTFTs*time.Millisecond {
			t.Errorf("turns %d, %d TTFTs, last kept %v", got.Turns, len(got.TTFTs), got.TTFTs[len(got.TTFTs)-1])
		}
	})
}

func TestOutcomeIsRecordedOnce(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("team:research", "c")
		score := 0.75
		o := Outcome{Completed: true, Score: &score, Feedback: "solved it", At: s.clock.Now()}
		if _, err := s.SetOutcome(ctx, k, o); !errors.Is(err, ErrUnknown) {
			t.Fatalf("outcome of an unknown conversation: %v, want ErrUnknown", err)
		}
		s.Record(s.turn(k, 5))
		s.tick(ctx)
		got, err := s.SetOutcome(ctx, k, o)
		if err != nil || got.Outcome == nil || !got.Outcome.Completed || *got.Outcome.Score != 0.75 ||
			got.Outcome.Feedback != "solved it" || got.Turns != 1 {
			t.Fatalf("SetOutcome = %+v, %v", got, err)
		}
		again, err := s.SetOutcome(ctx, k, Outcome{Completed: false, At: s.clock.Now()})
		if !errors.Is(err, ErrOutcomeSet) || again.Outcome == nil || !again.Outcome.Completed {
			t.Errorf("second outcome: %+v, %v; want ErrOutcomeSet with the first", again.Outcome, err)
		}
		if c := s.get(t, k); c.Outcome == nil || *c.Outcome.Score != 0.75 {
			t.Errorf("Get after outcome: %+v", c.Outcome)
		}
	})
}

func TestIdleConversationEndsOnce(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		quiet, busy := Key("", "quiet"), Key("", "busy")
		s.Record(s.turn(quiet, 1))
		s.Record(s.turn(quiet, 2))
		s.Record(s.turn(busy, 1))
		s.tick(ctx)
		s.clock.Advance(testIdle - time.Second)
		s.Record(s.turn(busy, 1)) // keeps busy going
		s.tick(ctx)
		if n := len(s.ended.list()); n != 0 {
			t.Fatalf("%d ended before the idle timeout", n)
		}
		s.clock.Advance(time.Second)
		s.tick(ctx)
		s.tick(ctx)
		got := s.ended.list()
		if len(got) != 1 || got[0].c.Key != quiet || got[0].why != EndIdle || got[0].c.Turns != 2 || got[0].c.CostMicros != 3 {
			t.Fatalf("ended = %+v; want quiet once, idle, 2 turns", got)
		}
		if _, err := s.Get(ctx, quiet); !errors.Is(err, ErrUnknown) {
			t.Errorf("ended conversation still answers: %v", err)
		}
		s.get(t, busy)
		// A turn after the end starts a new conversation under the same key.
		s.Record(s.turn(quiet, 7))
		s.tick(ctx)
		if c := s.get(t, quiet); c.Turns != 1 || c.CostMicros != 7 {
			t.Errorf("restarted conversation: %+v", c)
		}
	})
}

func TestMaxActiveEvictsTheIdlest(t *testing.T) {
	forEachStore(t, Options{MaxActive: 2}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		a, b, c := Key("", "a"), Key("", "b"), Key("", "c")
		s.Record(s.turn(a, 1))
		s.clock.Advance(time.Second)
		s.Record(s.turn(b, 1))
		s.clock.Advance(time.Second)
		s.Record(s.turn(a, 1)) // a is now the newer
		s.clock.Advance(time.Second)
		s.tick(ctx)
		s.Record(s.turn(c, 1))
		s.tick(ctx)
		got := s.ended.list()
		if len(got) != 1 || got[0].c.Key != b || got[0].why != EndEvicted {
			t.Fatalf("ended = %+v; want b evicted", got)
		}
		s.get(t, a)
		s.get(t, c)
	})
}

func TestResponsesLinkToTheirConversation(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("team:research", "resp_first")
		if err := s.Link(ctx, "resp_second", k); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Resolve(ctx, "resp_second"); err != nil || got != k {
			t.Errorf("Resolve = %q, %v; want %q", got, err, k)
		}
		if got, err := s.Resolve(ctx, "resp_unknown"); err != nil || got != "" {
			t.Errorf("Resolve of an unknown response = %q, %v", got, err)
		}
		s.clock.Advance(linkLifetime(testIdle) + time.Second)
		s.tick(ctx)
		if got, err := s.Resolve(ctx, "resp_second"); err != nil || got != "" {
			t.Errorf("Resolve after twice the idle timeout = %q, %v; want none", got, err)
		}
	})
}

func TestConversationsSurviveARestart(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		if s.reopen == nil {
			t.Skip("this store keeps nothing across a restart")
		}
		ctx := context.Background()
		k := Key("team:research", "kept")
		s.Record(s.turn(k, 4))
		s.Record(s.turn(k, 6))
		if _, err := s.SetOutcome(ctx, k, Outcome{Completed: true, At: s.clock.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := s.Link(ctx, "resp_x", k); err != nil {
			t.Fatal(err)
		}
		before := s.get(t, k)
		s2 := s.reopen(t)
		after := s2.get(t, k)
		if !before.First.Equal(after.First) || !before.Last.Equal(after.Last) {
			t.Errorf("times changed across the restart: %v %v -> %v %v", before.First, before.Last, after.First, after.Last)
		}
		after.First, after.Last, after.Outcome.At = before.First, before.Last, before.Outcome.At
		if !reflect.DeepEqual(before, after) {
			t.Errorf("after restart\n%+v\nwant\n%+v", after, before)
		}
		if got, _ := s2.Resolve(ctx, "resp_x"); got != k {
			t.Errorf("link lost across the restart: %q", got)
		}
		s2.Record(s2.turn(k, 1))
		s2.tick(ctx)
		if c := s2.get(t, k); c.Turns != 3 || c.CostMicros != 11 {
			t.Errorf("turn after restart: %+v", c)
		}
		// Ended while the gateway was down: observed by the next start.
		s2.clock.Advance(testIdle)
		s3 := s2.reopen(t)
		s3.tick(ctx)
		if got := s3.ended.list(); len(got) != 1 || got[0].c.Turns != 3 {
			t.Errorf("ended after restart = %+v", got)
		}
	})
}

func TestKeyScopesIDsByOwner(t *testing.T) {
	a, b := Key("team:a", "x"), Key("team:b", "x")
	if a == b || len(a) != 32 || Key("team:a", "x") != a {
		t.Errorf("Key(team:a, x) = %s, Key(team:b, x) = %s", a, b)
	}
	// The separator keeps owner and id apart.
	if Key("team:a", "bx") == Key("team:ab", "x") {
		t.Error("owner and id run together")
	}
}

func TestValidID(t *testing.T) {
	long := make([]byte, MaxIDLen+1)
	for i := range long {
		long[i] = 'a'
	}
	for id, want := range map[string]bool{"conv-1": true, "550e8400-e29b-41d4-a716-446655440000": true,
		"": false, "a\nb": false, "tab\t": false, string(long): false, string(long[:MaxIDLen]): true} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

// A response linked when a long turn starts still names its conversation
// while the conversation is active: the idle time counts from the turn's
// end, the link's life from its start.
func TestLinkOutlivesALongTurn(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("team:research", "resp_1")
		if err := s.Link(ctx, "resp_1", k); err != nil {
			t.Fatal(err)
		}
		s.clock.Advance(testIdle / 2) // the stream goes on
		s.Record(s.turn(k, 5))
		s.tick(ctx)
		s.clock.Advance(testIdle - time.Second) // idle, not long enough to end
		s.tick(ctx)
		s.get(t, k)
		if got, err := s.Resolve(ctx, "resp_1"); err != nil || got != k {
			t.Errorf("Resolve = %q, %v while its conversation is active; want %s", got, err, k)
		}
	})
}
