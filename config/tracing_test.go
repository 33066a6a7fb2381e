package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestBadTracingConfigs checks that each bad [tracing] value is reported at
// its line, and that a headers variable's value never appears in the error.
func TestBadTracingConfigs(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		env  map[string]string
		want []string
	}{
		{"tracing values", up + "[tracing]\nprotocol = \"zipkin\"\nsample_ratio = 1.5\nservice_name = \"\"\nqueue_size = 0\nexport_timeout_seconds = 0\n",
			nil, []string{
				`gateway.toml:5: tracing.protocol: "zipkin" is not an OTLP protocol; use "http/protobuf" or "grpc"`,
				`gateway.toml:6: tracing.sample_ratio: must be from 0 to 1, not 1.5`,
				`gateway.toml:7: tracing.service_name: must not be empty`,
				`gateway.toml:8: tracing.queue_size: must be at least 1, not 0`,
				`gateway.toml:9: tracing.export_timeout_seconds: must be greater than 0, not 0`,
			}},
		{"endpoint with another scheme", up + "[tracing]\nendpoint = \"ftp://collector:4318\"\n",
			nil, []string{`gateway.toml:5: tracing.endpoint: "ftp://collector:4318": scheme "ftp" is not http or https`}},
		{"endpoint without a port", up + "[tracing]\nendpoint = \"collector\"\n",
			nil, []string{`gateway.toml:5: tracing.endpoint: "collector" is neither host:port (a port from 1 to 65535) nor an http(s) URL`}},
		{"endpoint with an empty port", up + "[tracing]\nendpoint = \"collector:\"\n",
			nil, []string{`gateway.toml:5: tracing.endpoint: "collector:" is neither host:port (a port from 1 to 65535) nor an http(s) URL`}},
		{"endpoint with a port that is not a number", up + "[tracing]\nendpoint = \"collector:abc\"\n",
			nil, []string{`gateway.toml:5: tracing.endpoint: "collector:abc" is neither host:port (a port from 1 to 65535) nor an http(s) URL`}},
		{"URL with a port out of range", up + "[tracing]\nendpoint = \"http://collector:70000\"\n",
			nil, []string{`gateway.toml:5: tracing.endpoint: "http://collector:70000": port "70000" is not a number from 1 to 65535`}},
		{"insecure with an https URL", up + "[tracing]\nendpoint = \"https://collector:4318\"\ninsecure = true\n",
			nil, []string{`gateway.toml:6: tracing.insecure: is true but tracing.endpoint "https://collector:4318" is an https URL: drop insecure, or write the endpoint as http://`}},
		{"queue too large", up + "[tracing]\nqueue_size = 100000000\n",
			nil, []string{`gateway.toml:5: tracing.queue_size: 100000000 is over 1048576 spans`}},
		{"headers variable unset", up + "[tracing]\nheaders_env = \"OTLP_HEADERS\"\n",
			nil, []string{`gateway.toml:5: tracing.headers_env: environment variable OTLP_HEADERS is not set or is empty`}},
		{"headers variable malformed", up + "[tracing]\nheaders_env = \"OTLP_HEADERS\"\n",
			map[string]string{"OTLP_HEADERS": "Bearer otlp-secret"},
			[]string{`gateway.toml:5: tracing.headers_env: variable OTLP_HEADERS must hold key=value pairs separated by commas`}},
		{"misspelt tracing key", up + "[tracing]\nsample_ration = 0.5\n",
			nil, []string{`gateway.toml:5: tracing.sample_ration: unknown key; did you mean "sample_ratio"?`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "gateway.toml", fakeEnv(tc.env))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n%+v", tc.doc, c)
			}
			for _, want := range tc.want {
				if !containsLine(errLines(err), "config: "+want) {
					t.Errorf("error lacks %q; got:\n%v", want, err)
				}
			}
			if n := len(errLines(err)); n != len(tc.want) {
				t.Errorf("%d problems reported, want %d:\n%v", n, len(tc.want), err)
			}
			if strings.Contains(err.Error(), "otlp-secret") {
				t.Errorf("the error shows the headers' value: %v", err)
			}
		})
	}
}

// TestTracingHeadersAreSecret checks that headers read from headers_env
// never print with the config.
func TestTracingHeadersAreSecret(t *testing.T) {
	c := mustParse(t, up+"[tracing]\nenabled = true\nheaders_env = \"H\"\nendpoint = \"http://localhost:4318\"\n",
		map[string]string{"H": "authorization=Bearer otlp-secret"})
	if c.Tracing.Headers.Reveal() != "authorization=Bearer otlp-secret" {
		t.Fatalf("headers = %q", c.Tracing.Headers.Reveal())
	}
	for _, s := range []string{fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c.Tracing), fmt.Sprintf("%#v", c.Tracing)} {
		if strings.Contains(s, "otlp-secret") {
			t.Errorf("printed config shows the headers: %s", s)
		}
	}
}
