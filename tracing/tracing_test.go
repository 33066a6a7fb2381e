package tracing

import (
	"strings"
	"testing"
)

// Header values are percent-decoded, as the SDK decodes
// OTEL_EXPORTER_OTLP_HEADERS, and a bad escape is an error that does not
// quote the value.
func TestParseHeadersDecodesPercentEscapes(t *testing.T) {
	h, err := parseHeaders("Authorization=Basic%20dXNlcjpwYXNz, x-team = a%2Cb")
	if err != nil || h["Authorization"] != "Basic dXNlcjpwYXNz" || h["x-team"] != "a,b" {
		t.Fatalf("parseHeaders = %v, %v", h, err)
	}
	if _, err := parseHeaders("Authorization=secret%zz"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("a bad escape: %v, want an error that does not quote the value", err)
	}
}
