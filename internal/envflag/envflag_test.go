package envflag

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	env := map[string]string{"X_LEASE_TTL": "3s", "X_NAME": "from-env"}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	ttl := fs.Duration("lease-ttl", time.Second, "")
	name := fs.String("name", "default", "")
	other := fs.Int("other", 7, "")
	if err := Apply(fs, "X_", func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"-name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if *ttl != 3*time.Second || *name != "from-flag" || *other != 7 {
		t.Fatalf("ttl %v name %q other %d", *ttl, *name, *other)
	}
	env["X_OTHER"] = "seven"
	err := Apply(fs, "X_", func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), `X_OTHER="seven"`) {
		t.Fatalf("bad value: %v", err)
	}
}

func TestParseRefusesArguments(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("name", "", "")
	if err := Parse(fs, "X_", func(string) string { return "" }, []string{"-name", "a", "stray"}); err == nil || !strings.Contains(err.Error(), "stray") {
		t.Fatalf("Parse with a stray argument = %v", err)
	}
}
