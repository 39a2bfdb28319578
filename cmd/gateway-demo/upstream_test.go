package main

import (
	"io"
	"strings"
	"testing"

	"github.com/rationhq/ration/gateway"
)

func TestParseConfigUpstreamConns(t *testing.T) {
	c, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil || c.upstreamConns != gateway.DefaultUpstreamConns {
		t.Errorf("default %d, %v; want %d", c.upstreamConns, err, gateway.DefaultUpstreamConns)
	}
	env := map[string]string{"RATION_DEMO_UPSTREAM_CONNS": "64"}
	if c, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard); err != nil || c.upstreamConns != 64 {
		t.Errorf("env: %d, %v", c.upstreamConns, err)
	}
	for _, bad := range []string{"0", "-1", "70000"} {
		if _, err := parseConfig([]string{"-upstream-conns", bad}, func(string) string { return "" }, io.Discard); err == nil ||
			!strings.Contains(err.Error(), "-upstream-conns") {
			t.Errorf("-upstream-conns %s: error %v", bad, err)
		}
	}
}
