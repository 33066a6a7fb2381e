package ownership

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

func TestRedisTwoStoresOnOneServerShareClaims(t *testing.T) {
	srv := redistest.Start(t)
	a := NewRedis(srv.Client(t), "tollgate:own:")
	b := NewRedis(srv.Client(t), "tollgate:own:")
	ctx := context.Background()
	claim(t, a, "resp_1", "team:a", time.Hour)
	wantOwner(t, b, "resp_1", "team:a")
	if got, err := b.Claim(ctx, "resp_1", "team:b", time.Hour); err != nil || got != "team:a" {
		t.Fatalf("Claim on the other replica = %q, %v; want team:a", got, err)
	}
	if err := a.Release(ctx, "resp_1", "team:b"); err != nil {
		t.Fatal(err)
	}
	wantOwner(t, b, "resp_1", "team:a")
	if err := b.Release(ctx, "resp_1", "team:a"); err != nil {
		t.Fatal(err)
	}
	wantOwner(t, a, "resp_1", "")
	// Another prefix is another record.
	other := NewRedis(srv.Client(t), "other:own:")
	claim(t, a, "resp_2", "team:a", time.Hour)
	wantOwner(t, other, "resp_2", "")
}

func TestRedisKeyIsPrefixPlusID(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := NewRedis(c, "tollgate:own:")
	ctx := context.Background()
	claim(t, r, "resp_{x}1", "team:a", 90*time.Second)
	got, err := c.Get(ctx, "tollgate:own:resp_{x}1").Result()
	if err != nil || got != "team:a" {
		t.Fatalf("GET prefix+id = %q, %v", got, err)
	}
	ttl, err := c.PTTL(ctx, "tollgate:own:resp_{x}1").Result()
	if err != nil || ttl <= time.Minute || ttl > 90*time.Second {
		t.Fatalf("PTTL = %v, %v; want about 90s", ttl, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}
}

func TestRedisKeyOfAnotherTypeIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := NewRedis(c, "p:")
	ctx := context.Background()
	if err := c.HSet(ctx, "p:resp_1", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Claim(ctx, "resp_1", "team:a", time.Hour); err == nil {
		t.Fatal("Claim over a hash succeeded")
	}
	if o, err := r.Owner(ctx, "resp_1"); err == nil {
		t.Fatalf("Owner of a hash = %q, no error", o)
	}
}

func TestRedisDownIsAnErrorNotNoOwner(t *testing.T) {
	srv := redistest.Start(t, redistest.Persistent())
	// No retries, so each call fails at once while the server is down.
	r := NewRedis(srv.ClientWith(t, redis.Options{MaxRetries: -1}), "tollgate:own:")
	ctx := context.Background()
	claim(t, r, "resp_1", "team:secret-owner", 0)
	srv.Kill()
	if o, err := r.Owner(ctx, "resp_1"); err == nil {
		t.Fatalf("Owner with Redis down = %q, no error", o)
	}
	h, err := r.Claim(ctx, "resp_2", "team:secret-owner", time.Hour)
	if err == nil {
		t.Fatalf("Claim with Redis down = %q, no error", h)
	}
	if !strings.HasPrefix(err.Error(), "ownership: ") || strings.Contains(err.Error(), "secret-owner") {
		t.Fatalf("Claim error %q: want an ownership: error without the owner", err)
	}
	if err := r.Release(ctx, "resp_1", "team:secret-owner"); err == nil {
		t.Fatal("Release with Redis down: no error")
	}
	srv.Start()
	// go-redis may refuse to dial for a moment after failed dials.
	waitFor(t, "Claim to work again", func() bool {
		h, err := r.Claim(ctx, "resp_2", "team:b", time.Hour)
		return err == nil && h == "team:b"
	})
	wantOwner(t, r, "resp_1", "team:secret-owner") // a persistent Redis kept it
	wantOwner(t, r, "resp_2", "team:b")
}

func TestMillisRoundsUp(t *testing.T) {
	for ttl, want := range map[time.Duration]int64{
		-time.Second:                          0,
		0:                                     0,
		1:                                     1,
		time.Millisecond:                      1,
		time.Millisecond + 1:                  2,
		90 * time.Second:                      90_000,
		time.Duration(1<<63 - 1):              9223372036855,
		time.Hour + 500*time.Microsecond:      3_600_001,
		50*time.Millisecond - time.Nanosecond: 50,
	} {
		if got := millis(ttl); got != want {
			t.Errorf("millis(%v) = %d, want %d", ttl, got, want)
		}
	}
}
