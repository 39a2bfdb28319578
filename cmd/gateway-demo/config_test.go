package main

import (
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	gws, eng, _ := c.addrs()
	if c.instances != 3 || c.upstream != "" || c.allocatorURL != "" || c.keysFile != "" || c.dataDir == "" ||
		c.leaseTTL != 10*time.Second || c.logLevel != slog.LevelInfo {
		t.Errorf("defaults %+v", c)
	}
	if strings.Join(gws, " ") != "127.0.0.1:8080 127.0.0.1:8081 127.0.0.1:8082" || eng != "127.0.0.1:8083" {
		t.Errorf("addresses %v, engine %s", gws, eng)
	}
}

func TestParseConfigEnvAndFlags(t *testing.T) {
	env := map[string]string{
		"RATION_DEMO_INSTANCES":    "5",
		"RATION_DEMO_LISTEN":       "127.0.0.1:9000",
		"RATION_DEMO_UPSTREAM":     "http://127.0.0.1:8000",
		"RATION_DEMO_UPSTREAM_KEY": "up-secret",
	}
	c, err := parseConfig([]string{"-instances", "2", "-log-level", "debug"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	gws, eng, _ := c.addrs()
	if c.instances != 2 || c.upstream != "http://127.0.0.1:8000" || c.upstreamKey != "up-secret" || c.logLevel != slog.LevelDebug {
		t.Errorf("config %+v: the flag must win over the env, the env over the default", c)
	}
	if strings.Join(gws, " ") != "127.0.0.1:9000 127.0.0.1:9001" || eng != "127.0.0.1:9002" {
		t.Errorf("addresses %v %s", gws, eng)
	}
}

func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-instances", "0"}, nil, "-instances 0"},
		{[]string{"-instances", "65"}, nil, "-instances 65"},
		{[]string{"-token-file", "t"}, nil, "-token-file is for -allocator"},
		{[]string{"-allocator", "http://127.0.0.1:7450"}, nil, "needs -token-file"},
		{[]string{"-allocator", "http://a:7450,ftp://b:7450", "-token-file", "t"}, nil, "-allocator"},
		{[]string{"-allocator", "http://a:7450,https://b:7450", "-token-file", "t"}, nil, "same scheme"},
		{[]string{"-listen", "nope"}, nil, "-listen"},
		{[]string{"-listen", "127.0.0.1:65534"}, nil, "do not fit"},
		{[]string{"-lease-ttl", "0s"}, nil, "-lease-ttl"},
		{[]string{"-log-level", "loud"}, nil, "-log-level"},
		{[]string{"extra"}, nil, "unexpected arguments"},
		{nil, map[string]string{"RATION_DEMO_INSTANCES": "many"}, "RATION_DEMO_INSTANCES"},
	}
	for _, tt := range tests {
		_, err := parseConfig(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v %v: error %v, want %q", tt.args, tt.env, err, tt.want)
		}
	}
}

func TestParseConfigKeysReloadInterval(t *testing.T) {
	noEnv := func(string) string { return "" }
	if c, err := parseConfig(nil, noEnv, io.Discard); err != nil || c.keysReload != time.Second {
		t.Errorf("default %v, %v; want 1s", c.keysReload, err)
	}
	env := map[string]string{"RATION_DEMO_KEYS_RELOAD_INTERVAL": "250ms"}
	if c, err := parseConfig(nil, func(k string) string { return env[k] }, io.Discard); err != nil || c.keysReload != 250*time.Millisecond {
		t.Errorf("env: %v, %v", c.keysReload, err)
	}
	if c, err := parseConfig([]string{"-keys-reload-interval", "0"}, noEnv, io.Discard); err != nil || c.keysReload != 0 {
		t.Errorf("0 (off): %v, %v", c.keysReload, err)
	}
	for _, bad := range []string{"-1s", "1ms", "soon"} {
		if _, err := parseConfig([]string{"-keys-reload-interval", bad}, noEnv, io.Discard); err == nil ||
			!strings.Contains(err.Error(), "keys-reload-interval") {
			t.Errorf("-keys-reload-interval %s: error %v", bad, err)
		}
	}
}

// TestHelp: -help prints the flags, each with its RATION_DEMO_ variable,
// and the environment-only variable; the access log is on unless
// -access-log=false.
func TestHelp(t *testing.T) {
	var out strings.Builder
	if _, err := parseConfig([]string{"--help"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{usage, "RATION_DEMO_UPSTREAM_KEY", "  -access-log    (env RATION_DEMO_ACCESS_LOG)\n",
		"  -allocator string    (env RATION_DEMO_ALLOCATOR)\n"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the usage lacks %q:\n%s", want, out.String())
		}
	}
	for args, want := range map[string]bool{"": true, "-access-log=false": false} {
		c, err := parseConfig(strings.Fields(args), func(string) string { return "" }, io.Discard)
		if err != nil || c.accessLog != want {
			t.Fatalf("%q: access log %v (%v), want %v", args, c.accessLog, err, want)
		}
	}
}
