package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// shape is one load: how many requests at once, how many in all, and what
// the fake upstream answers each with.
type shape struct {
	name        string
	concurrency int
	requests    int
	stream      bool
	ttft, itl   time.Duration
	tokens      int
	// held: open requests streams and hold them (see holdStreams).
	held bool
}

// run is what one target did under one shape in one round.
type run struct {
	requests, errors int
	firstErr         string
	seconds          float64
	cpu              float64 // the target's CPU seconds over the run
	peakKiB          int64   // the target's peak RSS over the run
	perStreamKiB     float64 // held: RSS added per open stream
	ttft, itl        []time.Duration
}

func (r *run) rps() float64 { return float64(r.requests) / r.seconds }

// cpuPer1000 is the target's CPU seconds per 1,000 requests.
func (r *run) cpuPer1000() float64 { return r.cpu / float64(max(r.requests, 1)) * 1000 }

// newClient is the driver's HTTP client: one connection per request in
// flight, kept alive.
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: conns, MaxIdleConnsPerHost: conns,
		DialContext:        (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		DisableCompression: true,
	}}
}

func (s shape) request(ctx context.Context, url string) (*http.Request, error) {
	body := `{"model":"gpt-4o-mini","max_tokens":` + strconv.Itoa(s.tokens) +
		`,"messages":[{"role":"user","content":"Say something about gateways."}]`
	if s.stream {
		body += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	body += "}"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader([]byte(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Mock-TTFT-Ms", strconv.FormatInt(s.ttft.Milliseconds(), 10))
	req.Header.Set("X-Mock-ITL-Ms", strconv.FormatInt(s.itl.Milliseconds(), 10))
	req.Header.Set("X-Mock-Output-Tokens", strconv.Itoa(s.tokens))
	return req, nil
}

var (
	contentMark = []byte(`"content":"`)
	doneLine    = []byte("data: [DONE]")
)

// one sends one request and checks its answer: a stream must bring every
// token and its [DONE]. It returns the TTFT and the gaps between tokens.
func (s shape) one(ctx context.Context, c *http.Client, url string, itl []time.Duration) (ttft time.Duration, gaps []time.Duration, err error) {
	req, err := s.request(ctx, url)
	if err != nil {
		return 0, itl, err
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, itl, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, itl, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !s.stream {
		b, err := io.ReadAll(resp.Body)
		if err == nil && !bytes.Contains(b, []byte(`"completion_tokens":`+strconv.Itoa(s.tokens))) {
			err = fmt.Errorf("answer without its %d completion tokens: %.200s", s.tokens, b)
		}
		return time.Since(t0), itl, err
	}
	br := bufio.NewReaderSize(resp.Body, 8<<10)
	tokens, done := 0, false
	var last time.Time
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			now := time.Now()
			switch {
			case bytes.HasPrefix(line, []byte("data: {")) && bytes.Contains(line, contentMark) && !bytes.Contains(line, []byte(`"content":""`)):
				if tokens == 0 {
					ttft = now.Sub(t0)
				} else {
					itl = append(itl, now.Sub(last))
				}
				last = now
				tokens++
			case bytes.HasPrefix(line, doneLine):
				done = true
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return ttft, itl, err
		}
	}
	if !done || tokens < s.tokens {
		return ttft, itl, fmt.Errorf("stream ended after %d of %d tokens (done=%v)", tokens, s.tokens, done)
	}
	return ttft, itl, nil
}

// drive sends s.requests requests to t, s.concurrency at a time, and reads
// t's CPU and peak memory over them. Bounded: every request has a deadline.
func drive(s shape, t *target, timeout time.Duration) run {
	c := t.client(s.concurrency)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pids := t.pids()
	_ = resetPeak(pids)
	cpu0 := cpuSeconds(pids)
	var (
		next  atomic.Int64
		mu    sync.Mutex
		r     run
		wg    sync.WaitGroup
		start = time.Now()
	)
	// Workers start spread over one request's length, so that requests
	// arrive steadily, as the same number in flight would in production,
	// rather than all in the first millisecond.
	length := s.ttft + time.Duration(s.tokens)*s.itl
	for w := range s.concurrency {
		wg.Go(func() {
			if length > 0 {
				select {
				case <-time.After(length * time.Duration(w) / time.Duration(s.concurrency)):
				case <-ctx.Done():
				}
			}
			var ttfts, gaps []time.Duration
			errs, n := 0, 0
			first := ""
			for next.Add(1) <= int64(s.requests) {
				ttft, g, err := s.one(ctx, c, t.url, gaps)
				gaps = g
				n++
				if err != nil {
					if errs++; first == "" {
						first = err.Error()
					}
					continue
				}
				ttfts = append(ttfts, ttft)
			}
			mu.Lock()
			r.requests += n
			r.errors += errs
			if r.firstErr == "" {
				r.firstErr = first
			}
			r.ttft = append(r.ttft, ttfts...)
			r.itl = append(r.itl, gaps...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r.seconds = time.Since(start).Seconds()
	r.cpu = cpuSeconds(pids) - cpu0
	r.peakKiB = memKiB(pids, "VmHWM")
	return r
}

// holdStreams opens s.requests streams to t at once, each pausing after its
// first token, waits until all have it (or timeout), and reads t's RSS
// then against before: the memory an open stream costs t. Then it ends
// them.
func holdStreams(s shape, t *target, timeout time.Duration) run {
	c := newClient(s.requests)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pids := t.pids()
	before := memKiB(pids, "VmRSS")
	var (
		wg              sync.WaitGroup
		ready, failures atomic.Int64
		firstErr        atomic.Value
		release         = make(chan struct{})
		start           = time.Now()
	)
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	for range s.requests {
		wg.Go(func() {
			req, err := s.request(ctx, t.url)
			if err != nil {
				fail(err)
				return
			}
			resp, err := c.Do(req)
			if err != nil {
				fail(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				fail(fmt.Errorf("status %d", resp.StatusCode))
				return
			}
			br := bufio.NewReaderSize(resp.Body, 1024)
			for {
				line, err := br.ReadSlice('\n')
				if err != nil && err != bufio.ErrBufferFull {
					fail(fmt.Errorf("stream ended before its first token: %v", err))
					return
				}
				if bytes.Contains(line, contentMark) && !bytes.Contains(line, []byte(`"content":""`)) {
					break
				}
			}
			ready.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	for ready.Load()+failures.Load() < int64(s.requests) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let the target settle
	held := ready.Load()
	with := memKiB(pids, "VmRSS")
	r := run{requests: int(held), errors: s.requests - int(held), seconds: time.Since(start).Seconds(), peakKiB: with}
	if held > 0 {
		r.perStreamKiB = float64(with-before) / float64(held)
	}
	if v, ok := firstErr.Load().(string); ok {
		r.firstErr = v
	} else if r.errors > 0 {
		r.firstErr = "timed out before every stream had its first token"
	}
	close(release)
	cancel()
	wg.Wait()
	return r
}

// quantile returns the q-quantile of ds (sorted in place), 0 when empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q * float64(len(ds)-1))
	return ds[i]
}
