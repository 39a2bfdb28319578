//go:build faults

package faults

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recipeDoc is the page whose recipe TestClusterRecipe runs, relative to
// this package's directory.
const recipeDoc = "../docs/cluster.md"

// recipeSteps are the recipe's blocks, by the name of their marker, in
// the order the page gives them and the test runs them.
var recipeSteps = []string{"build", "tokens", "members", "leader", "gateways", "request", "failover", "after", "stop"}

// TestClusterRecipe runs docs/cluster.md's "Three members on one machine"
// as an operator would: every shell block marked `<!-- recipe: NAME -->`,
// as written, in order, in one bash session started at the repository's
// root, with HOME a temporary directory (the recipe works in
// ~/ration-try). bash runs in a network namespace of its own, so the
// recipe's fixed loopback ports cannot meet another process's. The test
// checks what a working cluster shows: three voters and one leader; a
// request admitted through a gateway; once the leader is killed, it is
// gone, another member leads and has granted a lease, and a gateway that
// needed that grant admitted its request from it (not on its fallback
// policy), following the new leader. The whole recipe, build included,
// must finish within 60 s.
func TestClusterRecipe(t *testing.T) {
	ctx := deadline(t, 60*time.Second)
	blocks, err := recipeBlocks(recipeDoc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range blocks {
		names = append(names, b.name)
	}
	if !slices.Equal(names, recipeSteps) {
		t.Fatalf("%s: recipe blocks %q, want %q (the test checks each step by its name)", recipeDoc, names, recipeSteps)
	}
	sh := startRecipeShell(t)
	step := func(name string) []string {
		t.Helper()
		i := slices.Index(recipeSteps, name)
		start := time.Now()
		out, status := sh.run(ctx, t, blocks[i].script)
		t.Logf("%s: %v, status %d", name, time.Since(start).Round(time.Millisecond), status)
		if status != 0 {
			t.Fatalf("recipe block %q ended with status %d:\n%s\n--- its output:\n%s", name, status, blocks[i].script, strings.Join(out, "\n"))
		}
		return out
	}

	step("build")
	step("tokens")
	step("members")
	members := parseMembers(step("leader"))
	var old member
	switch leaders := leadersOf(members); {
	case len(members) != 3 || len(leaders) != 1:
		t.Fatalf("`allocator cluster members` listed %d members with %d leaders, want 3 voters and 1 leader: %+v", len(members), len(leaders), members)
	default:
		old = leaders[0]
	}
	step("gateways")
	if out := step("request"); !slices.Contains(out, "HTTP/1.1 200 OK") {
		t.Fatalf("the request through a gateway was not admitted:\n%s", strings.Join(out, "\n"))
	}

	step("failover")
	if _, err := sh.scrape(ctx, t, old.url+"/metrics"); err == nil {
		t.Fatalf("the leader %s still answers after the recipe's kill -9", old.url)
	}
	var next member
	for _, m := range members {
		if m.url == old.url {
			continue
		}
		ms, err := sh.scrape(ctx, t, m.url+"/metrics")
		if err != nil {
			t.Fatalf("member %s after the failover: %v", m.id, err)
		}
		if ms.sum("ration_allocator_raft_role", "role", "leader") == 1 {
			if next.id != "" {
				t.Fatalf("two leaders after the failover: %s and %s", next.id, m.id)
			}
			next = m
		}
	}
	if next.id == "" {
		t.Fatalf("no member leads after %s was killed", old.id)
	}

	out := step("after")
	if !slices.ContainsFunc(out, func(l string) bool { return strings.HasPrefix(l, "HTTP/1.1 200") }) {
		t.Fatalf("no request admitted through the second gateway after the failover:\n%s", strings.Join(out, "\n"))
	}
	after, err := parseMetrics(strings.NewReader(strings.Join(slices.DeleteFunc(out, func(l string) bool {
		return !strings.HasPrefix(l, "ration_")
	}), "\n")))
	if err != nil {
		t.Fatalf("the gateway's metrics in the recipe's output: %v", err)
	}
	if got := after.sum("ration_spender_allocator_leader", "member", next.url); got != 1 {
		t.Errorf("the gateway does not follow the new leader %s (allocator_leader %v)", next.url, got)
	}
	if fb, leased := after.sum("ration_spender_admitted_total", "path", "fallback"),
		after.sum("ration_spender_admitted_total", "path", "slow")+after.sum("ration_spender_admitted_total", "path", "local"); fb != 0 || leased < 1 {
		t.Errorf("after the failover the gateway admitted %v from leases and %v on its fallback policy, want at least 1 and 0", leased, fb)
	}
	ms, err := sh.scrape(ctx, t, next.url+"/metrics")
	if err != nil {
		t.Fatalf("the new leader %s: %v", next.id, err)
	}
	if got := ms.sum("ration_allocator_calls_total", "method", "Acquire", "code", "ok"); got < 1 {
		t.Errorf("the new leader %s granted no Acquire call", next.id)
	}
	step("stop")
	if out, _ := sh.run(ctx, t, "grep -c 'every lease returned' gateway.log"); !slices.Equal(out, []string{"1"}) {
		t.Errorf("the gateways did not log that they returned every lease on SIGTERM (grep -c: %q)", out)
	}
}

// recipeBlock is one marked shell block of a page.
type recipeBlock struct {
	name   string
	script string
}

var recipeMarker = regexp.MustCompile(`^<!-- recipe: ([a-z-]+) -->$`)

// recipeBlocks returns the blocks of the Markdown file at path marked by
// a line `<!-- recipe: NAME -->` right before their opening "```sh" fence,
// in the file's order.
func recipeBlocks(path string) ([]recipeBlock, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var blocks []recipeBlock
	for i := 0; i < len(lines); i++ {
		m := recipeMarker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		if i+1 >= len(lines) || lines[i+1] != "```sh" {
			return nil, fmt.Errorf("%s:%d: recipe marker %q not followed by a ```sh fence", path, i+1, m[1])
		}
		end := slices.Index(lines[i+2:], "```")
		if end < 0 {
			return nil, fmt.Errorf("%s:%d: recipe block %q never closed", path, i+1, m[1])
		}
		blocks = append(blocks, recipeBlock{name: m[1], script: strings.Join(lines[i+2:i+2+end], "\n")})
		i += 2 + end
	}
	return blocks, nil
}

// member is one line of `allocator cluster members`.
type member struct {
	id, raftAddr, url string
	leader            bool
}

// parseMembers reads the lines of `allocator cluster members`: id, raft
// address, lease API URL and role, tab-separated; other lines are
// skipped.
func parseMembers(out []string) []member {
	var ms []member
	for _, l := range out {
		f := strings.Split(l, "\t")
		if len(f) != 4 || !strings.HasPrefix(f[3], "voter") {
			continue
		}
		ms = append(ms, member{id: f[0], raftAddr: f[1], url: f[2], leader: strings.HasSuffix(f[3], " leader")})
	}
	return ms
}

func leadersOf(ms []member) []member {
	return slices.DeleteFunc(slices.Clone(ms), func(m member) bool { return !m.leader })
}

// recipeShell is one bash session the recipe's blocks are typed into.
type recipeShell struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string // its stdout and stderr, line by line; closed at EOF
	end   string      // the marker a block's last line starts with
	all   *logBuffer  // everything it printed, for a failure's log
}

// startRecipeShell starts bash at the module's root with HOME a fresh
// temporary directory, in a new network namespace whose loopback it
// brings up. Go keeps its caches and settings: GOENV, GOCACHE, GOPATH
// and GOMODCACHE are passed as the test's go command sees them, since
// their defaults follow HOME. RATION_* variables are not passed on. The
// shell and everything it starts are killed when the test ends.
func startRecipeShell(t *testing.T) *recipeShell {
	t.Helper()
	for _, tool := range []string{"bash", "curl", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the recipe needs %s: %v", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("the recipe runs in a network namespace of its own, which needs root")
	}
	home := t.TempDir()
	goEnv, err := exec.Command("go", "env", "GOENV", "GOCACHE", "GOPATH", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	env := []string{"HOME=" + home}
	for i, v := range strings.Split(strings.TrimSpace(string(goEnv)), "\n") {
		env = append(env, []string{"GOENV", "GOCACHE", "GOPATH", "GOMODCACHE"}[i]+"="+v)
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "RATION_") && !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, name+"=") }) {
			env = append(env, kv)
		}
	}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	sh := &recipeShell{cmd: exec.Command("bash"), lines: make(chan string, 1024), end: "@@recipe-end-" + hex.EncodeToString(nonce) + " ", all: &logBuffer{}}
	sh.cmd.Dir = ".." // the module's root
	sh.cmd.Env = env
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if sh.in, err = sh.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.cmd.Stdout, sh.cmd.Stderr = w, w
	if err := sh.cmd.Start(); err != nil {
		t.Fatalf("starting bash in a network namespace: %v", err)
	}
	w.Close()
	go func() {
		defer close(sh.lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(sh.all, sc.Text())
			sh.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		// bash runs its background jobs in its own process group.
		_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
		_ = sh.cmd.Wait()
		r.Close()
		if t.Failed() {
			t.Logf("--- the recipe's shell session:\n%s", sh.all.tail(32<<10))
			logs, _ := filepath.Glob(filepath.Join(home, "ration-try", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("--- %s:\n%s", l, (&logBuffer{b: b}).tail(8<<10))
			}
		}
	})
	if out, status := sh.run(t.Context(), t, "ip link set lo up"); status != 0 {
		t.Fatalf("bringing up the namespace's loopback: %s", strings.Join(out, "\n"))
	}
	return sh
}

// run types script into the shell and returns what it printed and the
// status of its last command.
func (sh *recipeShell) run(ctx context.Context, t *testing.T, script string) ([]string, int) {
	t.Helper()
	if _, err := fmt.Fprintf(sh.in, "%s\necho \"%s$?\"\n", script, sh.end); err != nil {
		t.Fatalf("writing to the shell: %v", err)
	}
	var out []string
	for {
		select {
		case l, ok := <-sh.lines:
			if !ok {
				t.Fatalf("the shell ended while running:\n%s\n--- output:\n%s", script, strings.Join(out, "\n"))
			}
			if s, found := strings.CutPrefix(l, sh.end); found {
				status, err := strconv.Atoi(s)
				if err != nil {
					t.Fatalf("the shell's end marker %q: %v", l, err)
				}
				return out, status
			}
			out = append(out, l)
		case <-ctx.Done():
			t.Fatalf("%v while running:\n%s\n--- output so far:\n%s", ctx.Err(), script, strings.Join(out, "\n"))
		}
	}
}

// scrape reads url's metrics with curl inside the shell's network
// namespace: the test's own look, not the recipe's.
func (sh *recipeShell) scrape(ctx context.Context, t *testing.T, url string) (metrics, error) {
	t.Helper()
	out, status := sh.run(ctx, t, "curl -sSf --max-time 5 "+url)
	if status != 0 {
		return nil, fmt.Errorf("curl %s: status %d: %s", url, status, strings.Join(out, "\n"))
	}
	return parseMetrics(strings.NewReader(strings.Join(out, "\n")))
}
