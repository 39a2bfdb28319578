package envflag

import (
	"errors"
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

// PrintDefaults names each flag's variable and keeps what
// flag.PrintDefaults says: the type, the usage, a default that is not the
// zero value (quoted for a string).
func TestPrintDefaults(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Duration("lease-ttl", time.Second, "lease time to live")
	fs.String("data-dir", "data", "the `directory` of the store")
	fs.Bool("strict", false, "strict mode")
	var b strings.Builder
	PrintDefaults(&b, fs, "X_")
	want := "  -data-dir directory    (env X_DATA_DIR)\n    \tthe directory of the store (default \"data\")\n" +
		"  -lease-ttl duration    (env X_LEASE_TTL)\n    \tlease time to live (default 1s)\n" +
		"  -strict    (env X_STRICT)\n    \tstrict mode\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// ParseHelp prints the head and the flags on -help, and nothing on a bad
// flag, whose error it returns.
func TestParseHelp(t *testing.T) {
	for _, tc := range []struct {
		arg, out string
		help     bool
	}{
		{"-h", "usage: t\n  -n int    (env X_N)\n    \ta number\n", true},
		{"--help", "usage: t\n  -n int    (env X_N)\n    \ta number\n", true},
		{"-bogus", "", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.Int("n", 0, "a number")
		var b strings.Builder
		err := ParseHelp(fs, "X_", func(string) string { return "" }, []string{tc.arg}, &b, "usage: t\n")
		if errors.Is(err, flag.ErrHelp) != tc.help || err == nil || b.String() != tc.out {
			t.Errorf("%s: %v, printed %q", tc.arg, err, b.String())
		}
	}
}
