package mockllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// params are the settings of one request: Options overridden by X-Mock-*
// headers.
type params struct {
	ttft, itl, jitter time.Duration
	outputTokens      int
	tokensPerChunk    int
	cachedTokens      int
	reasoningTokens   int
	noUsage           bool
	// toolCall is the X-Mock-Tool-Call header, trimmed: "" when absent.
	toolCall string
	// toolArgs is the X-Mock-Tool-Arguments header: the JSON object a tool
	// call passes (ToolArguments when absent).
	toolArgs string
	fault    fault
}

// fault is a parsed fault spec (the X-Mock-Fault header or an Inject
// spec). Event counts are -1 when unset.
type fault struct {
	// set reports that the spec named at least one fault.
	set          bool
	status       int
	retryAfter   string
	retryAfterMs string
	errType      string
	errCode      string
	disconnect   int
	errorEvent   int
	malformed    int
	hang         int
	stall        time.Duration
}

// noFault is the fault of a request without one.
func noFault() fault {
	return fault{disconnect: -1, errorEvent: -1, malformed: -1, hang: -1}
}

// maxHeaderTokens bounds token counts from headers, so a typo cannot make the
// mock generate for hours.
const maxHeaderTokens = 1 << 20

var errNoValue = errors.New("empty value")

// parseParams reads the X-Mock-* headers over the server's options.
func (s *Server) parseParams(h http.Header) (params, error) {
	p := params{
		ttft: s.opts.TTFT, itl: s.opts.ITL, jitter: s.opts.Jitter,
		outputTokens: s.opts.OutputTokens, tokensPerChunk: s.opts.TokensPerChunk,
		fault: noFault(),
	}
	var err error
	if p.ttft, err = headerMs(h, "X-Mock-TTFT-Ms", p.ttft); err != nil {
		return p, err
	}
	if p.itl, err = headerMs(h, "X-Mock-ITL-Ms", p.itl); err != nil {
		return p, err
	}
	if p.jitter, err = headerMs(h, "X-Mock-Jitter-Ms", p.jitter); err != nil {
		return p, err
	}
	if p.outputTokens, err = headerInt(h, "X-Mock-Output-Tokens", p.outputTokens, 1); err != nil {
		return p, err
	}
	if p.tokensPerChunk, err = headerInt(h, "X-Mock-Tokens-Per-Chunk", p.tokensPerChunk, 1); err != nil {
		return p, err
	}
	if p.cachedTokens, err = headerInt(h, "X-Mock-Cached-Tokens", 0, 0); err != nil {
		return p, err
	}
	if p.reasoningTokens, err = headerInt(h, "X-Mock-Reasoning-Tokens", 0, 0); err != nil {
		return p, err
	}
	if v := h.Get("X-Mock-No-Usage"); v != "" {
		if p.noUsage, err = strconv.ParseBool(v); err != nil {
			return p, fmt.Errorf("mockllm: header X-Mock-No-Usage %q: %w", v, err)
		}
	}
	p.toolCall = strings.TrimSpace(h.Get(toolCallHeader))
	p.toolArgs = ToolArguments
	if v := strings.TrimSpace(h.Get("X-Mock-Tool-Arguments")); v != "" {
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(v), &obj) != nil || obj == nil {
			return p, fmt.Errorf("mockllm: header X-Mock-Tool-Arguments %q: not a JSON object", v)
		}
		p.toolArgs = v
	}
	if v := h.Get("X-Mock-Fault"); v != "" {
		if p.fault, err = parseFault(v, "header X-Mock-Fault"); err != nil {
			return p, err
		}
	}
	return p, nil
}

// headerMs reads a non-negative decimal number of milliseconds.
func headerMs(h http.Header, name string, def time.Duration) (time.Duration, error) {
	v := h.Get(name)
	if v == "" {
		return def, nil
	}
	d, err := parseMs(v)
	if err != nil {
		return 0, fmt.Errorf("mockllm: header %s %q: %w", name, v, err)
	}
	return d, nil
}

func parseMs(v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return 0, err
	}
	// One hour is far beyond any test and keeps the product in range.
	if math.IsNaN(f) || f < 0 || f > 3.6e6 {
		return 0, errors.New("want milliseconds in [0, 3600000]")
	}
	return time.Duration(f * float64(time.Millisecond)), nil
}

// headerInt reads an integer in [lo, maxHeaderTokens].
func headerInt(h http.Header, name string, def, lo int) (int, error) {
	v := h.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := parseCount(v, lo)
	if err != nil {
		return 0, fmt.Errorf("mockllm: header %s %q: %w", name, v, err)
	}
	return n, nil
}

func parseCount(v string, lo int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, err
	}
	if n < lo || n > maxHeaderTokens {
		return 0, fmt.Errorf("want an integer in [%d, %d]", lo, maxHeaderTokens)
	}
	return n, nil
}

// parseFault parses "key=value;key=value"; what names the source in errors.
func parseFault(v, what string) (fault, error) {
	f := noFault()
	for part := range strings.SplitSeq(v, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f.set = true
		key, val, _ := strings.Cut(part, "=")
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		var err error
		if val == "" {
			err = errNoValue
		} else {
			switch key {
			case "status":
				f.status, err = strconv.Atoi(val)
				if err == nil && (f.status < 400 || f.status > 599) {
					err = errors.New("want a status in [400, 599]")
				}
			case "retry-after":
				err = checkNonNegative(val, "seconds")
				f.retryAfter = val
			case "retry-after-ms":
				err = checkNonNegative(val, "milliseconds")
				f.retryAfterMs = val
			case "type":
				f.errType = val
			case "code":
				f.errCode = val
			case "disconnect":
				f.disconnect, err = parseCount(val, 0)
			case "error-event":
				f.errorEvent, err = parseCount(val, 0)
			case "malformed":
				f.malformed, err = parseCount(val, 0)
			case "hang":
				f.hang, err = parseCount(val, 0)
			case "stall":
				f.stall, err = parseMs(val)
			default:
				err = errors.New("unknown fault")
			}
		}
		if err != nil {
			return f, fmt.Errorf("mockllm: %s %q: %s: %w", what, v, key, err)
		}
	}
	if f.status == 0 && (f.retryAfter != "" || f.retryAfterMs != "" || f.errType != "" || f.errCode != "") {
		return f, fmt.Errorf("mockllm: %s %q: retry-after, retry-after-ms, type and code need status", what, v)
	}
	return f, nil
}

// checkNonNegative checks that v is a finite non-negative decimal; the value
// is sent verbatim, so a client parsing it as a float must succeed.
func checkNonNegative(v, unit string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return err
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return errors.New("want non-negative " + unit)
	}
	return nil
}
