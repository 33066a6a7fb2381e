package config

import (
	"fmt"
	"log/slog"
)

// redacted is what every printed or encoded form of a non-empty Secret shows.
const redacted = "<secret>"

// Secret is a credential read from the environment, such as an upstream's own
// API key. Every way of printing or encoding it (every fmt verb, JSON, text,
// slog) gives "<secret>", so that a Config can be logged, dumped
// or put in an error whole without leaking a key. An empty Secret prints as
// "" so that "not set" stays visible. Only Reveal returns the value; call it
// where the key is put on the upstream request and nowhere else.
type Secret string

// String returns "<secret>", or "" when the secret is empty.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString returns the same as String, so that %#v does not print the value.
func (s Secret) GoString() string { return s.String() }

// Format implements fmt.Formatter. Without it, a verb that does not apply to
// strings (%d, %t, ...) would print the raw value in its %!d(...) notice.
// Every verb formats "<secret>" instead.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, s.GoString())
		return
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), s.String())
}

// MarshalJSON encodes the secret as the JSON string "<secret>" (or "").
func (s Secret) MarshalJSON() ([]byte, error) {
	if s == "" {
		return []byte(`""`), nil
	}
	return []byte(`"` + redacted + `"`), nil
}

// MarshalText returns "<secret>" (or nothing), for TOML, XML and other
// encoders that use encoding.TextMarshaler.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// LogValue implements slog.LogValuer so that log attributes show "<secret>".
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Reveal returns the secret's value.
func (s Secret) Reveal() string { return string(s) }
