package check

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// repoRoot is the ration checkout this module sits in.
const repoRoot = "../.."

// envPrefix is what every ration command reads its flags from the
// environment under (internal/envflag): -lease-ttl is RATION_LEASE_TTL.
const envPrefix = "RATION_"

// command is one of ration's commands, as its -help describes it.
type command struct {
	name     string
	flags    map[string]bool   // flag name -> whether it takes a value
	defaults map[string]string // flag name -> its default, where -help prints one
}

// flagLine is the first line of a flag in the flag package's usage:
// "  -name" for a boolean, "  -name type" otherwise, either followed by
// "(env RATION_NAME)" where the command names the variable.
var flagLine = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)(?: (\S+))?(?:\s+\(env [A-Z0-9_]+\))?$`)

// defaultNote is how the usage ends a flag's text: "(default 15s)".
var defaultNote = regexp.MustCompile(`\(default "?([^")]*)"?\)$`)

// loadCommand reads cmd/<name>'s flags from its -help. go run builds it
// once; the go command caches the executable for the later calls.
func loadCommand(t *testing.T, name string) command {
	t.Helper()
	out, err := runCommand(name, []string{"-help"}, nil)
	if err != nil {
		t.Fatalf("%s -help: %v\n%s", name, err, out)
	}
	c := command{name: name, flags: map[string]bool{}, defaults: map[string]string{}}
	var last string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil {
			last = m[1]
			c.flags[last] = m[2] != ""
			continue
		}
		if m := defaultNote.FindStringSubmatch(strings.TrimSpace(line)); m != nil && last != "" {
			c.defaults[last] = m[1]
		}
	}
	if len(c.flags) == 0 {
		t.Fatalf("%s -help lists no flag:\n%s", name, out)
	}
	return c
}

// runCommand runs cmd/<name> of the main module with args, in an
// environment with no RATION_* variable but env's. It builds the command
// as the image does (static, -trimpath), so that CI compiles the
// packages once for both.
func runCommand(name string, args []string, env map[string]string) (string, error) {
	// A cold build on a loaded machine is slow; a hang is not.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"run", "-trimpath", "./cmd/" + name}, args...)...)
	cmd.Dir = repoRoot
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// invocation is how a manifest or unit runs a command: its arguments and
// its environment's RATION_* variables.
type invocation struct {
	where string // the file and object, for messages
	args  []string
	env   map[string]string
}

// problems reports what in inv the command would not accept: a RATION_*
// variable no flag has (the command ignores those silently, so a typo
// would go unnoticed), and, from the command itself, an argument that is
// not a flag, a flag it does not have or a value its parser refuses: it
// runs with inv's arguments and environment and -help last, so it parses
// every value, then prints its usage and exits 0.
func (c command) problems(inv invocation) []string {
	var out []string
	for k := range inv.env {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, envPrefix), "_", "-"))
		if _, ok := c.flags[name]; !ok {
			out = append(out, fmt.Sprintf("%s: %s is no flag of %s", inv.where, k, c.name))
		}
	}
	if text, err := runCommand(c.name, append(append([]string{}, inv.args...), "-help"), inv.env); err != nil {
		out = append(out, fmt.Sprintf("%s: %s refuses its flags: %v\n%s", inv.where, c.name, err, firstLines(text, 3)))
	}
	return out
}

// parseArgs reads "-name=value", "-name value" and "-name" (a boolean)
// into a map, as the flag package does; a flag c does not have, or an
// argument that is no flag, is an error.
func parseArgs(args []string, c command) (map[string]string, error) {
	m := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("argument %q is not a flag", a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, ok := c.flags[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("-%s is no flag", name)
		case !hasValue && takesValue:
			if i+1 == len(args) {
				return nil, fmt.Errorf("-%s has no value", name)
			}
			i++
			value = args[i]
		case !hasValue:
			value = "true"
		}
		m[name] = value
	}
	return m, nil
}

// setting is a flag's value as the command sees it: the argument, else
// the environment variable, else the default.
func (c command) setting(name string, args map[string]string, env map[string]string) string {
	if v, ok := args[name]; ok {
		return v
	}
	if v, ok := env[envPrefix+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]; ok {
		return v
	}
	return c.defaults[name]
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// allocatorAsUsed is the allocator as far as the files use it, for the
// tests that break the files and need no build.
func allocatorAsUsed() command {
	flags := map[string]bool{"cluster-bootstrap": false}
	for _, f := range []string{"listen", "data-dir", "token-file", "admin-token-file", "peer-token-file",
		"cluster-id", "cluster-listen", "cluster-peers", "shutdown-timeout"} {
		flags[f] = true
	}
	return command{name: "allocator", flags: flags, defaults: map[string]string{"shutdown-timeout": "15s"}}
}

// breakage is one way to break a deployment file: old replaced by new,
// which the check must report with a problem containing want.
type breakage struct{ name, old, new, want string }

// expectReported applies each breakage alone to src, the text of file,
// and expects check to report it.
func expectReported(t *testing.T, file, src string, cases []breakage, check func(src string) []string) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(src, tc.old) {
				t.Fatalf("%s has no %q", file, tc.old)
			}
			problems := check(strings.Replace(src, tc.old, tc.new, 1))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("problems %q, want one containing %q", problems, tc.want)
			}
		})
	}
}
