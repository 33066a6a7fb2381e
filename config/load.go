package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// Default returns the configuration used for every key a file leaves out.
// It has no upstream: a usable configuration names at least one.
func Default() Config {
	return Config{
		Server: Server{
			Listen:                   ":8080",
			MaxBodyBytes:             32 << 20,
			MaxEventBytes:            16 << 20,
			ReadHeaderTimeoutSeconds: 10,
			IdleTimeoutSeconds:       120,
			DrainTimeoutSeconds:      30,
		},
		Auth: Auth{
			Mode:       "passthrough",
			RequireKey: true,
		},
		Metrics: Metrics{
			LatencyBuckets:   []int64{0, 500, 2000, 8000, 32000},
			Labels:           map[string]string{},
			Models:           []string{},
			MaxModels:        100,
			NativeHistograms: true,
		},
		SLO: SLO{
			TTFTMs: 2000,
			TPOTMs: 100,
			E2ELMs: 0,
		},
		Log: Log{
			Level:     "info",
			Format:    "json",
			AccessLog: true,
		},
	}
}

// DefaultUpstream returns the defaults of one [[upstreams]] table; its Name
// and BaseURL are empty.
func DefaultUpstream() Upstream {
	return Upstream{
		Dialects:              []string{"openai", "anthropic"},
		TimeoutSeconds:        600,
		ConnectTimeoutSeconds: 10,
		IncludeUsage:          true,
		MaxIdleConns:          256,
	}
}

// DemoConfig returns Default() with one upstream, named "mock", at baseURL
// serving both dialects. `gateway demo` points it at its in-process mock.
func DemoConfig(baseURL string) Config {
	c := Default()
	u := DefaultUpstream()
	u.Name = "mock"
	u.BaseURL = baseURL
	c.Upstreams = []Upstream{u}
	c.normalize()
	return c
}

// Load reads, decodes and validates the file at path, reading upstream keys
// from the process environment. Every error names the file, and the line
// where one is known.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The *PathError already names the path.
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path, os.Getenv)
}

// Parse decodes the TOML document data over Default(), strictly: unknown keys
// and values of the wrong type are errors. It then fills the defaults of each
// [[upstreams]] table for the keys that table leaves out, trims trailing
// slashes from base_url, reads each api_key_env through getenv (os.Getenv
// when nil), and validates the result.
//
// name is the file name used in error messages, which read
// "config: <name>:<line>: <key>: <problem>". The error joins every problem
// found (see errors.Join); decoding problems stop before validation.
func Parse(data []byte, name string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	// Editors on Windows may start the file with a byte order mark, which
	// TOML does not allow.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))

	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, decodeError(err, name, indexDoc(data))
	}

	// The typed decode cannot tell a key set to its zero value from a key
	// left out, and each [[upstreams]] table starts from a zero Upstream, so
	// a second, untyped decode says which keys each table holds.
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		return nil, decodeError(err, name, indexDoc(data))
	}
	fillUpstreamDefaults(c.Upstreams, raw["upstreams"])

	c.normalize()
	c.resolveSecrets(getenv)
	if err := c.Validate(); err != nil {
		return nil, locate(err, name, indexDoc(data))
	}
	return &c, nil
}

// fillUpstreamDefaults sets, in each upstream, the default of every key its
// table in the file leaves out. raw is the decoded "upstreams" value: an
// array of tables, whether written as [[upstreams]] or inline.
func fillUpstreamDefaults(ups []Upstream, raw any) {
	tables, _ := raw.([]any)
	def := DefaultUpstream()
	for i := range ups {
		var present map[string]any
		if i < len(tables) {
			present, _ = tables[i].(map[string]any)
		}
		has := func(key string) bool { _, ok := present[key]; return ok }
		u := &ups[i]
		if !has("dialects") {
			u.Dialects = append([]string(nil), def.Dialects...)
		}
		if !has("timeout_seconds") {
			u.TimeoutSeconds = def.TimeoutSeconds
		}
		if !has("connect_timeout_seconds") {
			u.ConnectTimeoutSeconds = def.ConnectTimeoutSeconds
		}
		if !has("include_usage") {
			u.IncludeUsage = def.IncludeUsage
		}
		if !has("max_idle_conns") {
			u.MaxIdleConns = def.MaxIdleConns
		}
	}
}

// normalize puts values that have several spellings into one form.
func (c *Config) normalize() {
	for i := range c.Upstreams {
		// "https://host/" and "https://host" are the same endpoint; URL
		// appends "/v1/..." and must not produce "//v1".
		c.Upstreams[i].BaseURL = strings.TrimRight(c.Upstreams[i].BaseURL, "/")
	}
}

// resolveSecrets reads each upstream's key from the variable its api_key_env
// names. Invalid names are left for Validate to report.
func (c *Config) resolveSecrets(getenv func(string) string) {
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		u.APIKey = ""
		if u.APIKeyEnv != "" && envNameRE.MatchString(u.APIKeyEnv) {
			u.APIKey = Secret(getenv(u.APIKeyEnv))
		}
	}
}

// locate adds the file name and, where the index knows it, the line of the
// offending key to each problem Validate reported.
func locate(err error, name string, idx *docIndex) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var fe *fieldError
		if !errors.As(e, &fe) {
			out = append(out, e)
			continue
		}
		located := *fe
		located.file = name
		located.line = idx.line(fe.key)
		out = append(out, &located)
	}
	return errors.Join(out...)
}
