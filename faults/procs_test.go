//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rationhq/ration/internal/testkit"
)

// proc is one process a test started. Its stdout and stderr both go to
// logs.
type proc struct {
	name string
	cmd  *exec.Cmd
	logs *logBuffer
	done chan struct{} // closed once the process has exited and its output is read
	err  error         // Wait's result, once done is closed
}

// startProc starts path with args as a child of the test. It is killed
// (SIGCONT then SIGKILL, so that a stopped one dies too) when the test
// ends, and its log is printed if the test failed. Pdeathsig kills it
// even if the test binary itself dies (a panic, go test's timeout); it
// fires when the thread that started the child ends, so no thread of the
// test may end while the test runs (see inNetns).
// RATION_* variables of the test's environment are not passed on, so
// that a developer's settings cannot change what a case runs.
func startProc(t *testing.T, name, path string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(path, args...), logs: &logBuffer{}, done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RATION_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			t.Logf("--- log of %s (pid %d, %s):\n%s", name, p.pid(), p.state(), p.logs.tail(48<<10))
		}
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// state describes the process for messages: running, or how it ended.
func (p *proc) state() string {
	if !p.exited() {
		return "running"
	}
	if p.err == nil {
		return "exited 0"
	}
	return p.err.Error()
}

// alive fails the test if the process has ended: a gateway or allocator
// that exits on its own during a case has crashed.
func (p *proc) alive(t *testing.T) {
	t.Helper()
	if p.exited() {
		t.Errorf("%s (pid %d) is no longer running: %s", p.name, p.pid(), p.state())
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: sending %v: %v", p.name, sig, err)
	}
}

// kill ends the process if it still runs and waits for it.
func (p *proc) kill(t *testing.T) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) still runs 10 s after SIGKILL", p.name, p.pid())
	}
}

// stopped waits up to d for the process to exit after SIGTERM, which
// must end it with status 0. One still running then gets SIGQUIT, which
// makes a Go program print every goroutine's stack before it exits, and
// the test fails with its log (less the lines that only repeat) and those
// stacks.
func (p *proc) stopped(ctx context.Context, t *testing.T, d time.Duration) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, d)
	err := p.wait(wctx)
	cancel()
	if p.exited() {
		if err != nil {
			t.Errorf("%s after SIGTERM: %v", p.name, err)
		}
		return
	}
	p.signal(t, syscall.SIGQUIT)
	_ = p.wait(ctx)
	var kept []string
	for _, l := range strings.Split(p.logs.String(), "\n") {
		if !strings.Contains(l, "failed to heartbeat to") && !strings.Contains(l, "failed to appendEntries to") {
			kept = append(kept, l)
		}
	}
	t.Errorf("%s (pid %d) still ran %v after SIGTERM; its log without raft's repeated failures, then its goroutines after SIGQUIT:\n%s",
		p.name, p.pid(), d, strings.Join(kept, "\n"))
}

// wait waits for the process to exit, at most until ctx ends.
func (p *proc) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%s did not exit: %w", p.name, ctx.Err())
	}
}

// logBuffer collects a process's output; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// tail is the last n bytes of the log, from a line start.
func (l *logBuffer) tail(n int) string {
	s := l.String()
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "[... earlier lines cut ...]\n" + s
}

// poll calls cond every interval until it reports done, returns an error,
// or ctx ends. It is how the suite waits for real processes: never a
// sleep without a deadline.
func poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	tk := time.NewTicker(interval)
	defer tk.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tk.C:
		}
	}
}

// pause waits d, or less if ctx ends first: the load runs meanwhile.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// deadline is the test's context, bounded to d: every wait of the case
// ends by then.
func deadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// control is the client for health, readiness and metrics: no keep-alive,
// so that scraping a server never leaves a connection (and its goroutine)
// behind in what a case measures.
var control = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// getStatus returns the status of GET url.
func getStatus(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := control.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// waitStatus waits until GET url answers want, failing the test if p
// exits first or ctx ends.
func waitStatus(ctx context.Context, t *testing.T, p *proc, url string, want int) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("%s exited: %s", p.name, p.state())
		}
		code, err := getStatus(ctx, url)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = strconv.Itoa(code)
		return code == want, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to answer %d (last: %s): %v", url, want, last, err)
	}
	return time.Since(start)
}

// freePort returns a loopback address no one listens on. The allocator
// needs one fixed port across its restarts (the gateways keep its URL),
// so 127.0.0.1:0 will not do for it.
func freePort(t *testing.T) string { return testkit.FixedAddr(t) }

// The credentials of every allocator the suite starts: the gateways'
// bearer token, and a cluster member's admin token and peer secret.
const (
	token      = "faults-token"
	adminToken = "faults-admin-token"
	peerToken  = "faults-peer-secret"
)

// allocatorProc is cmd/allocator on a fixed address and data directory,
// so that it can be killed and started again in their place: a loopback
// port, or (a cluster member) its own address in a network namespace.
type allocatorProc struct {
	*proc
	name      string // for process names: "allocator", "member m0"
	addr      string
	dataDir   string
	tokenFile string
	ttl       time.Duration
	extra     []string
	starts    int
	net       *netLayout // non-nil: the process runs in net's namespace host
	host      int
}

// startAllocator starts cmd/allocator with lease TTL ttl (and extra
// flags) and waits until /readyz answers 200. An empty dataDir is a fresh
// temp directory.
func startAllocator(ctx context.Context, t *testing.T, ttl time.Duration, dataDir string, extra ...string) *allocatorProc {
	t.Helper()
	dir := t.TempDir()
	if dataDir == "" {
		dataDir = filepath.Join(dir, "data")
	}
	a := &allocatorProc{name: "allocator", addr: freePort(t), dataDir: dataDir, tokenFile: writeToken(t, dir), ttl: ttl, extra: extra}
	a.restart(ctx, t)
	return a
}

// writeToken writes the suite's gateway token file in dir and returns its
// path.
func writeToken(t *testing.T, dir string) string {
	t.Helper()
	return writeSecret(t, dir, "token", token)
}

// writeSecret writes a token file (mode 600) holding secret, named name
// in dir, and returns its path.
func writeSecret(t *testing.T, dir, name, secret string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// restart starts a new allocator process in the place of the last one
// (which must have exited) and waits until it is ready.
func (a *allocatorProc) restart(ctx context.Context, t *testing.T) time.Duration {
	t.Helper()
	a.launch(t)
	return waitStatus(ctx, t, a.proc, a.url()+"/readyz", http.StatusOK)
}

// launch starts a new allocator process in the place of the last one
// (which must have exited), without waiting for it.
func (a *allocatorProc) launch(t *testing.T) {
	t.Helper()
	if a.proc != nil && !a.proc.exited() {
		t.Fatalf("%s restart while pid %d still runs", a.name, a.pid())
	}
	a.starts++
	path, args := bin.allocator, append([]string{"-listen", a.addr, "-data-dir", a.dataDir, "-token-file", a.tokenFile,
		"-lease-ttl", a.ttl.String()}, a.extra...)
	if a.net != nil {
		path, args = a.net.command(a.host, path, args...)
	}
	a.proc = startProc(t, fmt.Sprintf("%s (start %d)", a.name, a.starts), path, nil, args...)
}

func (a *allocatorProc) url() string { return "http://" + a.addr }

// allocatorAddr is where a gateway finds its allocator: one process, or
// the members of a cluster.
type allocatorAddr interface {
	apiURL() string    // -allocator: one URL, or every member's, comma-separated
	tokenPath() string // -token-file
}

func (a *allocatorProc) apiURL() string    { return a.url() }
func (a *allocatorProc) tokenPath() string { return a.tokenFile }

// gatewayProc is one cmd/gateway-demo process: its instances' base URLs.
type gatewayProc struct {
	*proc
	urls []string
}

// gatewaySpec says how to run one gateway-demo process.
type gatewaySpec struct {
	instances int
	keysFile  string
	spenderID string        // -spender-id; "" = the demo's unique default
	alloc     allocatorAddr // nil = the demo's embedded allocator
	ttl       time.Duration // the embedded allocator's lease TTL (with alloc == nil)
	extra     []string      // more flags
}

// instanceListening is the demo's log line naming an instance's URL.
var instanceListening = regexp.MustCompile(`msg="gateway-demo: instance listening" instance=(\d+) url=(\S+)`)

// startGateway starts gateway-demo on free loopback ports and waits until
// every instance answers /healthz.
func startGateway(ctx context.Context, t *testing.T, name string, s gatewaySpec) *gatewayProc {
	t.Helper()
	// No access log: the cases count and time requests by the thousand,
	// and keep every process's log in memory.
	args := []string{"-listen", "127.0.0.1:0", "-instances", strconv.Itoa(s.instances), "-keys", s.keysFile, "-drain", "2s", "-access-log=false"}
	if s.alloc != nil {
		args = append(args, "-allocator", s.alloc.apiURL(), "-token-file", s.alloc.tokenPath())
	} else {
		args = append(args, "-data", t.TempDir(), "-lease-ttl", s.ttl.String())
	}
	if s.spenderID != "" {
		args = append(args, "-spender-id", s.spenderID)
	}
	g := &gatewayProc{proc: startProc(t, name, bin.gateway, nil, append(args, s.extra...)...)}
	err := poll(ctx, 20*time.Millisecond, func() (bool, error) {
		if g.exited() {
			return false, fmt.Errorf("exited: %s", g.state())
		}
		m := instanceListening.FindAllStringSubmatch(g.logs.String(), -1)
		if len(m) < s.instances {
			return false, nil
		}
		g.urls = make([]string, s.instances)
		for _, x := range m {
			i, _ := strconv.Atoi(x[1])
			if i < 1 || i > s.instances {
				return false, fmt.Errorf("log names instance %d of %d", i, s.instances)
			}
			g.urls[i-1] = x[2]
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%s: waiting for its %d instances to listen: %v", name, s.instances, err)
	}
	for _, u := range g.urls {
		waitStatus(ctx, t, g.proc, u+"/healthz", http.StatusOK)
	}
	return g
}

// interrupt stops the gateway as Ctrl-C does and waits for it to exit;
// the demo then drains, returns every instance's leases and says so.
func (g *gatewayProc) interrupt(ctx context.Context, t *testing.T) {
	t.Helper()
	g.signal(t, syscall.SIGINT)
	if err := g.wait(ctx); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Errorf("%s: exit after SIGINT: %v", g.name, err)
			return
		}
		t.Fatalf("%s: %v", g.name, err)
	}
}

// urlsOf lists every instance of every gateway process, in order.
func urlsOf(gs ...*gatewayProc) []string {
	var urls []string
	for _, g := range gs {
		urls = append(urls, g.urls...)
	}
	return urls
}

// epochRefused is the spender's warning when the allocator refused its
// epoch or sequence (spender/machine.go): two processes fighting over one
// spender id, or a lost exactly-once record. A healthy fleet never logs it.
const epochRefused = "refused our epoch"

// noEpochTrouble fails the test for every gateway whose log has the
// warning.
func noEpochTrouble(t *testing.T, gs ...*gatewayProc) {
	t.Helper()
	for _, g := range gs {
		if n := strings.Count(g.logs.String(), epochRefused); n > 0 {
			t.Errorf("%s logged %q %d times", g.name, epochRefused, n)
		}
	}
}
