package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
)

// reloadable are the keys a running gateway takes from a reloaded file: a
// table named here reloads whole. Every other key is fixed when the gateway
// starts (it opened a listener, a Redis client, a state file, registered its
// metrics or its exporter with it), and a reload that changes one is refused.
var reloadable = map[string]bool{
	"upstreams":                    true,
	"routes":                       true,
	"slo":                          true,
	"models":                       true,
	"teams":                        true,
	"keys":                         true,
	"probe":                        true,
	"log.level":                    true,
	"ratelimit.default_max_tokens": true,
}

// ReloadChanges compares the running configuration with next. It returns
// the reloadable keys that differ (whole tables, such as "keys", or
// "log.level"), in the order Config declares them, and an error naming
// every key that differs but cannot change without a restart.
func ReloadChanges(running, next *Config) ([]string, error) {
	changed, fixed := diff(reflect.ValueOf(*running), reflect.ValueOf(*next), "")
	if len(fixed) == 0 {
		return changed, nil
	}
	errs := make([]error, len(fixed))
	for i, k := range fixed {
		errs[i] = &fieldError{key: k, msg: "differs from the running configuration and cannot change without a restart"}
	}
	return changed, errors.Join(errs...)
}

// diff walks the TOML fields of two Config (or table) values, returning the
// reloadable keys that differ and the fixed ones that do. The fields of an
// embedded struct without a toml tag are walked as the struct's own.
func diff(a, b reflect.Value, prefix string) (changed, fixed []string) {
	for i := range a.NumField() {
		f := a.Type().Field(i)
		va, vb := a.Field(i), b.Field(i)
		name := tomlName(f)
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			c, x := diff(va, vb, prefix)
			changed, fixed = append(changed, c...), append(fixed, x...)
			continue
		}
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		switch {
		case reloadable[key]:
			if !reflect.DeepEqual(va.Interface(), vb.Interface()) {
				changed = append(changed, key)
			}
		case f.Type.Kind() == reflect.Struct:
			c, x := diff(va, vb, key)
			changed, fixed = append(changed, c...), append(fixed, x...)
		case !reflect.DeepEqual(va.Interface(), vb.Interface()):
			fixed = append(fixed, key)
		}
	}
	return changed, fixed
}

// LoadReload reads the file at path as Load does and checks that it can
// replace running (see ReloadChanges): every error names the file, and the
// line of the key where the file sets it.
func LoadReload(path string, running *Config) (*Config, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	return ParseReload(data, path, os.Getenv, running)
}

// ParseReload is LoadReload for a document already read.
func ParseReload(data []byte, name string, getenv func(string) string, running *Config) (*Config, []string, error) {
	next, err := Parse(data, name, getenv)
	if err != nil {
		return nil, nil, err
	}
	changed, err := ReloadChanges(running, next)
	if err != nil {
		return nil, nil, locate(err, name, indexDoc(data))
	}
	return next, changed, nil
}
