package ownership

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store shared by every replica through Redis: one string key
// per id, prefix+id, holding the owner, with the claim's ttl as the key's
// expiry. Each call touches one key, so under Redis Cluster the keys spread
// over the slots; the prefix should not hold a hash tag ("{…}"), which
// would put every key in one slot. How durable the records are is Redis's
// configuration: a Redis that loses its data loses them, and Owner then
// answers "" for every id.
type Redis struct {
	client redis.UniversalClient
	prefix string
}

var _ Store = (*Redis)(nil)

// claimScript sets KEYS[1] to ARGV[1] unless it holds another value, with
// an expiry of ARGV[2] milliseconds (0: none), and returns the value held
// afterwards. Claiming again as the holder renews (or removes) the expiry.
var claimScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local ms = tonumber(ARGV[2])
if not cur then
  if ms > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
  return ARGV[1]
end
if cur == ARGV[1] then
  if ms > 0 then
    redis.call('PEXPIRE', KEYS[1], ms)
  else
    redis.call('PERSIST', KEYS[1])
  end
end
return cur
`)

// releaseScript deletes KEYS[1] if it holds ARGV[1].
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// NewRedis returns a Redis store keeping id's owner at prefix+id (for
// example "tollgate:own:"). The client is the caller's: Close leaves it
// open.
func NewRedis(client redis.UniversalClient, prefix string) *Redis {
	return &Redis{client: client, prefix: prefix}
}

// Claim implements Store in one script, so concurrent claims from any
// replicas have one winner. A ttl is rounded up to the millisecond.
func (r *Redis) Claim(ctx context.Context, id, owner string, ttl time.Duration) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if err := checkOwner(owner); err != nil {
		return "", err
	}
	holder, err := claimScript.Run(ctx, r.client, []string{r.prefix + id}, owner, strconv.FormatInt(millis(ttl), 10)).Text()
	if err != nil {
		return "", fmt.Errorf("ownership: redis claim: %w", err)
	}
	return holder, nil
}

// Owner implements Store with one GET.
func (r *Redis) Owner(ctx context.Context, id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	owner, err := r.client.Get(ctx, r.prefix+id).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ownership: redis owner: %w", err)
	}
	return owner, nil
}

// Release implements Store: the key is deleted only if it holds owner.
func (r *Redis) Release(ctx context.Context, id, owner string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := checkOwner(owner); err != nil {
		return err
	}
	if err := releaseScript.Run(ctx, r.client, []string{r.prefix + id}, owner).Err(); err != nil {
		return fmt.Errorf("ownership: redis release: %w", err)
	}
	return nil
}

// Close implements Store. It does nothing: the client is the caller's.
func (r *Redis) Close() error { return nil }

// millis is ttl in whole milliseconds, rounded up; 0 for ttl <= 0.
func millis(ttl time.Duration) int64 {
	if ttl <= 0 {
		return 0
	}
	ms := ttl.Milliseconds()
	if time.Duration(ms)*time.Millisecond < ttl {
		ms++
	}
	return ms
}
