package main

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestBenchSweepCommand: `gateway bench -sweep` runs every level against
// a mock that serves 4 requests at once and prints the table and its
// saturation line. Without a TTFT objective every level passes whatever
// the machine's speed (the knee by timing is bench's BenchmarkSweepKnee);
// with one no request can meet, the first level breaks, the command exits
// 1 and, stopping after a break by default, runs no other level.
func TestBenchSweepCommand(t *testing.T) {
	mock := mockllm.New(mockllm.Options{TTFT: 20 * time.Millisecond, ITL: 5 * time.Millisecond,
		OutputTokens: 8, MaxConcurrent: 4})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	base := []string{"bench", "-url", up.URL, "-model", "m", "-quiet", "-max-tokens", "64", "-timeout", "10s",
		"-slo-ttft-ms", "0", "-slo-tpot-ms", "0", "-slo-e2e-ms", "0"}

	var out, errb strings.Builder
	if code := run(append(base, "-requests", "16", "-sweep", "1,2,4,8"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "saturation: concurrency 8 or more (no level broke)") {
		t.Errorf("sweep table has no saturation at 8:\n%s", out.String())
	}
	if st := mock.Stats(); st.Requests < 4*16 || st.PeakInFlight > 4 || st.Queued == 0 {
		t.Errorf("mock saw %d requests, peak %d in flight, %d queued; want 64 (and the path check), at most 4, level 8 queueing",
			st.Requests, st.PeakInFlight, st.Queued)
	}

	// No level can meet a 1 ms TTFT: exit 1, with the table printed; the
	// default -sweep-stop runs no level after the first.
	out.Reset()
	errb.Reset()
	if code := run(append(base, "-requests", "4", "-sweep", "1,2", "-slo-ttft-ms", "1", "-json"), &out, &errb); code != 1 {
		t.Fatalf("unmeetable SLO: exit %d, want 1; stderr %s", code, errb.String())
	}
	var rep struct {
		Saturation int `json:"saturation"`
		Levels     []struct {
			Concurrency int `json:"concurrency"`
		} `json:"levels"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil || rep.Saturation != 0 || len(rep.Levels) != 1 {
		t.Errorf("JSON %v: %+v; want no saturation and one level\n%s", err, rep, out.String())
	}
}

// TestBenchStagesCommand: a healthy staged run goes through every stage; a
// dead port stops at stage 1 with exit 1.
func TestBenchStagesCommand(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 8}))
	t.Cleanup(up.Close)
	var out, errb strings.Builder
	args := []string{"bench", "-url", up.URL, "-model", "m", "-quiet", "-max-tokens", "64", "-stages", "2,5"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "== stage 1: 2 requests ==") || !strings.Contains(s, "== stage 2: 5 requests ==") {
		t.Errorf("table lacks a stage:\n%s", s)
	}
	// -min-goodput gates the last stage: a 1 ms TTFT fails it.
	out.Reset()
	errb.Reset()
	if code := run(append(args, "-slo-ttft-ms", "1", "-min-goodput", "0.5"), &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "below -min-goodput") {
		t.Errorf("gate: exit %d, stderr %q; want 1", code, errb.String())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	out.Reset()
	errb.Reset()
	if code := run([]string{"bench", "-url", dead, "-model", "m", "-quiet", "-stages", "3,30", "-json"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "stage 1 of 2") {
		t.Errorf("dead port: exit %d, stderr %q; want 1 and stage 1 named", code, errb.String())
	}
	var rep struct {
		Stages []json.RawMessage `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil || len(rep.Stages) != 1 {
		t.Errorf("dead port JSON %v: %d stages, want 1", err, len(rep.Stages))
	}
}

// TestBenchModeFlagErrors: conflicting or malformed mode flags are usage
// errors (exit 2) and send nothing.
func TestBenchModeFlagErrors(t *testing.T) {
	m := mockllm.New(mockllm.Options{})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	base := []string{"bench", "-url", up.URL, "-model", "m", "-quiet"}
	for _, bad := range [][]string{
		{"-sweep", "1,2", "-stages", "5,30"},
		{"-sweep", "1,2", "-rate", "5"},
		{"-sweep", "1,2", "-concurrency", "3"},
		{"-sweep", "1,2", "-min-goodput", "0.9"},
		{"-sweep", "2,1"},
		{"-sweep", "1,x"},
		{"-sweep", "0,1"},
		{"-sweep", "1,2", "-sweep-goodput", "1.5"},
		{"-sweep-goodput", "0.9"},
		{"-stages", "5,30", "-requests", "10"},
		{"-stages", "5,,30"},
	} {
		var out, errb strings.Builder
		if code := run(append(base, bad...), &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage); stderr %s", bad, code, errb.String())
		}
	}
	if got := m.Stats().Requests; got != 0 {
		t.Errorf("usage errors sent %d requests", got)
	}
}
