package ratelimit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/fleet"
)

func TestShareOfDividesEveryLimitRoundingUp(t *testing.T) {
	s := lteam("a", Limits{RPM: 1200, TPM: 1001, Concurrency: 2, TokensPerDay: 20000,
		CostPerDayMicros: 7, CostPerMonthMicros: 0})
	got := shareOf(s, 3).Limits
	want := Limits{RPM: 400, TPM: 334, Concurrency: 1, TokensPerDay: 6667, CostPerDayMicros: 3}
	if got != want {
		t.Fatalf("share of 3 = %+v, want %+v", got, want)
	}
	if shareOf(s, 1) != s {
		t.Fatal("a share of 1 is the whole")
	}
}

// TestLocalShareStartsWhereTheFleetStood: a bucket the fleet emptied stays
// empty in each share and refills at the share's rate; a budget with 3,000
// tokens left gives each of 3 shares 1,000; a spent budget stays spent.
func TestLocalShareStartsWhereTheFleetStood(t *testing.T) {
	l, clock := newTestLocal(t, lt0)
	a := lteam("a", Limits{RPM: 1200})
	b := lteam("b", Limits{TokensPerDay: 20000})
	c := lteam("c", Limits{TokensPerDay: 20000})
	now := lt0.UnixNano()
	l.startShare(shared{subject: a, rpmFull: now + int64(time.Minute)}, 3)
	l.startShare(shared{subject: b, at: lt0, tpd: 17000, budgets: 1}, 3)
	l.startShare(shared{subject: c, at: lt0, tpd: 20500, budgets: 1}, 3)

	admitted := func(s Subject, tokens int64) int {
		n := 0
		for range 2000 {
			d := ladmit(t, l, Request{Subjects: []Subject{shareOf(s, 3)}, Tokens: tokens})
			if !d.Allowed {
				break
			}
			lsettle(t, l, d.Lease, tokens, 0)
			n++
		}
		return n
	}
	if n := admitted(a, 0); n != 0 {
		t.Fatalf("an empty bucket's share admitted %d", n)
	}
	clock.Set(lt0.Add(3 * time.Second)) // the fleet refills 60, a share 20
	if n := admitted(a, 0); n != 20 {
		t.Fatalf("a share admitted %d after 3 s, want 20", n)
	}
	if n := admitted(b, 100); n != 10 {
		t.Fatalf("a share of 3,000 tokens left admitted %d requests of 100, want 10", n)
	}
	if n := admitted(c, 100); n != 0 {
		t.Fatalf("a spent budget's share admitted %d", n)
	}
}

// offsetClock is the real clock moved forward by a settable offset, so that
// an outage of seconds passes at once while Redis, before it, keeps its
// own clock.
type offsetClock struct{ d atomic.Int64 }

func (c *offsetClock) Now() time.Time           { return time.Now().Add(time.Duration(c.d.Load())) }
func (c *offsetClock) advance(by time.Duration) { c.d.Add(int64(by)) }

// TestFleetOutageAdmitsTheLimitNotNTimesIt runs three replicas on one Redis,
// each knowing the fleet through its heartbeat: team A (1,200 per minute)
// has emptied its bucket and team B (20,000 tokens a day) has spent its
// budget when Redis dies. Over 10 s of outage, in which the limits allow
// 200 requests of A and none of B, the fleet admits at most 1.2 times that
// for A and none for B. Each replica alone would admit a full burst and
// 200, and B's usage until its own fallback filled.
func TestFleetOutageAdmitsTheLimitNotNTimesIt(t *testing.T) {
	srv := startRedisServer(t)
	clock := &offsetClock{}
	a := lteam("a", Limits{RPM: 1200})
	b := lteam("b", Limits{TokensPerDay: 20000})
	const replicas = 3
	var fos [replicas]*Failover
	var fls [replicas]*fleet.Fleet
	for i := range replicas {
		c := srv.clientWith(t, noRetry)
		fl, err := fleet.New(context.Background(), c, fleet.Options{Interval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		fls[i] = fl
		t.Cleanup(func() { _ = fl.Close(context.Background()) })
		fos[i] = newTestFailover(t, FailoverOptions{
			Primary: NewRedis(c, RedisOptions{}), Fallback: NewLocal(LocalOptions{Now: clock.Now}),
			Now: clock.Now, Replicas: fl.Live,
		})
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if fls[0].Live() == replicas && fls[1].Live() == replicas && fls[2].Live() == replicas {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replicas never saw each other: %d %d %d", fls[0].Live(), fls[1].Live(), fls[2].Live())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	admit := func(f *Failover, s Subject, tokens int64) bool {
		d, err := f.Admit(ctx, Request{Subjects: []Subject{s}, Tokens: tokens})
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if d.Allowed {
			mustSettle(t, f, d.Lease, tokens, 0)
		}
		return d.Allowed
	}

	// Healthy: A's bucket emptied and B's budget spent, through every
	// replica, each of which then sees the refusal.
	refusedA, refusedB := 0, 0
	for i := 0; i < 4000 && (refusedA < replicas || refusedB < replicas); i++ {
		f := fos[i%replicas]
		if !admit(f, a, 0) {
			refusedA++
		}
		if !admit(f, b, 120) {
			refusedB++
		}
	}
	if refusedA < replicas || refusedB < replicas {
		t.Fatalf("the limits never refused: A %d, B %d refusals", refusedA, refusedB)
	}

	srv.kill()
	const outage, step = 10 * time.Second, 100 * time.Millisecond
	gotA, gotB := 0, 0
	for range outage / step {
		clock.advance(step)
		for _, f := range fos {
			for range 100 {
				if !admit(f, a, 0) {
					break
				}
				gotA++
			}
			if admit(f, b, 120) {
				gotB++
			}
		}
	}
	for i, f := range fos {
		if !f.Degraded() {
			t.Fatalf("replica %d never noticed the outage", i)
		}
	}
	due := int(1200 * outage / time.Minute)
	t.Logf("outage of %v: team A admitted %d where %d were due (×%.2f), team B %d", outage, gotA, due,
		float64(gotA)/float64(due), gotB)
	if gotA > due*12/10 {
		t.Errorf("team A: the fleet admitted %d in the outage, more than 1.2 × the %d due", gotA, due)
	}
	if gotA < due*8/10 {
		t.Errorf("team A: the fleet admitted %d in the outage, far below the %d due", gotA, due)
	}
	if gotB != 0 {
		t.Errorf("team B's spent budget admitted %d requests in the outage", gotB)
	}
}

// TestLocalShareKeepsTheFallbacksOpenReservations: a stream the fallback
// admitted in one outage is still open when the next starts; the new share
// keeps its reservation, so that its Settle takes back only what it added.
func TestLocalShareKeepsTheFallbacksOpenReservations(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	whole := lteam("b", Limits{TokensPerDay: 30000})
	share := shareOf(whole, 3) // 10,000
	open := ladmit(t, l, Request{Subjects: []Subject{share}, Tokens: 8000})
	if !open.Allowed {
		t.Fatal("the first outage's stream was refused")
	}
	// The fleet had used 15,000 of 30,000 when the second outage started:
	// this replica's share has 5,000 left, besides the stream's 8,000.
	l.startShare(shared{subject: whole, at: lt0, tpd: 15000, budgets: 1}, 3)
	lsettle(t, l, open.Lease, 500, 0)
	st := peekLocal(t, l, share, KindTokensPerDay)
	if st.Used+st.Reserved != 5000+500 || st.Remaining != 4500 {
		t.Fatalf("after the stream settled with 500 tokens: %+v, want 5,500 held and 4,500 left", st)
	}
}

// TestOutageRefusalNamesTheFleetsLimit: during an outage a replica of
// three admits its share, but what it tells the caller is the fleet's
// limit: a team at 20,040 of its 20,000 tokens is refused as spent with
// "Limit 20000", not its share's 6,667, and the RPM headers say 1,200.
func TestOutageRefusalNamesTheFleetsLimit(t *testing.T) {
	srv := startRedisServer(t)
	primary := NewRedis(srv.clientWith(t, noRetry), RedisOptions{})
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		Replicas: func() int { return 3 }, RetryAfter: time.Hour})
	team := teamSubject("red", Limits{RPM: 1200, TokensPerDay: 20000})
	req := Request{Subjects: []Subject{team}, Tokens: 100}
	d := mustAdmit(t, f, req)
	mustSettle(t, f, d.Lease, 20040, 0)
	if d := mustAdmit(t, f, req); d.Allowed || !d.Refused.Spent() {
		t.Fatalf("with Redis: %+v, want spent", d.Refused)
	}
	srv.kill()
	d = mustAdmit(t, f, req)
	if d.Allowed || d.Lease != nil && d.Lease.issuer != f.fallback {
		t.Fatalf("during the outage: %+v, want a refusal by the fallback", d)
	}
	if r := d.Refused; r.Kind != KindTokensPerDay || r.Limit != 20000 || !r.Spent() || r.Used < 20000 {
		t.Errorf("refused %+v; want the team's 20,000 tokens, spent", r)
	}
	for _, st := range d.States {
		if st.Kind == KindRPM && st.Limit != 1200 {
			t.Errorf("RPM state %+v; want the team's limit of 1,200", st)
		}
	}
	if st := peekKind(t, f, team, KindTokensPerDay); st.Limit != 20000 || !st.Spent() {
		t.Errorf("Peek during the outage: %+v; want the team's 20,000, spent", st)
	}
}
