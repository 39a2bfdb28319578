package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"regexp"
	"strings"
	"testing"
)

// TestHelp: -help (and -h, --help) prints the subcommands and every flag
// with its environment variable, on the writer given (stdout in main);
// each subcommand the usage lists answers its own -help with its flags,
// as does "cluster -help", rather than "unknown operation".
func TestHelp(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out bytes.Buffer
		if _, err := parseConfig([]string{arg}, noEnv, &out); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s: %v, want flag.ErrHelp", arg, err)
		}
		for _, want := range []string{opsUsage, "Exit status:", "  -cluster-id string    (env RATION_CLUSTER_ID)\n",
			"  -token-file string    (env RATION_TOKEN_FILE)\n", "  -read-timeout duration    (env RATION_READ_TIMEOUT)\n"} {
			if !strings.Contains(out.String(), want) {
				t.Fatalf("%s: the usage lacks %q:\n%s", arg, want, out.String())
			}
		}
	}

	subcommands := regexp.MustCompile(`(?m)^  allocator ((?:cluster )?[a-z]+) `).FindAllStringSubmatch(opsUsage, -1)
	if len(subcommands) != 5 {
		t.Fatalf("subcommands in the usage: %q", subcommands)
	}
	for _, m := range append(subcommands, []string{"", "cluster"}) {
		args := append(strings.Fields(m[1]), "--help")
		if !isOp(args) {
			t.Fatalf("%q is not taken for a subcommand", args)
		}
		var out bytes.Buffer
		err := runOp(context.Background(), args, noEnv, &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%q: %v, want flag.ErrHelp", args, err)
		}
		want := "usage: allocator " + m[1] + " [flags]\n"
		if m[1] == "cluster" {
			want = "usage:\n" + opsUsage
		}
		if !strings.HasPrefix(out.String(), want) || (m[1] != "cluster" && !strings.Contains(out.String(), "-addr string    (env RATION_ADDR)")) {
			t.Fatalf("%q printed:\n%s", args, out.String())
		}
	}
}
