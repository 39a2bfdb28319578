package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/rationhq/ration/internal/testkit"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"google.golang.org/protobuf/proto"
)

// buildBinary builds cmd/allocator once per test binary.
var buildOnce struct {
	sync.Once
	path string
	err  error
}

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ration-allocator-bin-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "allocator")
		cmd := exec.Command("go", "build", "-o", buildOnce.path, ".")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

type process struct {
	cmd  *exec.Cmd
	addr string
	logs *testkit.SyncBuffer
	done chan error
}

// startBinary runs the real allocator and waits until its lease service
// is up (the log's "allocator: serving"; a cluster member may not be
// ready yet).
func startBinary(t *testing.T, args ...string) *process {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"-listen", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, logs: &testkit.SyncBuffer{}, done: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var addr string
		for sc.Scan() {
			line := sc.Text()
			p.logs.Write([]byte(line + "\n"))
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil {
				if rec.Msg == "allocator: listening" {
					addr = rec.Addr
				}
				if rec.Msg == "allocator: serving" {
					ready <- addr
				}
			}
		}
		io.Copy(io.Discard, stderr)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case p.addr = <-ready:
	case err := <-p.done:
		t.Fatalf("allocator exited: %v\n%s", err, p.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("allocator not ready:\n%s", p.logs.String())
	}
	return p
}

type crashSpender struct {
	id       string
	seq      uint64
	answered map[uint64]*leasev1.AcquireResponse
	lastAns  uint64
	lastReq  *leasev1.AcquireRequest // the latest request sent (maybe unanswered)
	pending  bool                    // lastReq got no reply
}

func crashRequest(id string, seq uint64) *leasev1.AcquireRequest {
	req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: id, Epoch: 1, Sequence: seq}}
	for k := 0; k < 4; k++ {
		req.Keys = append(req.Keys, &leasev1.KeyAcquire{
			Key: fmt.Sprintf("key-%d", k), Limits: &leasev1.Limits{Rpm: 600_000, Tpm: 6000},
			Want: &leasev1.Amount{Requests: 1, Tokens: 40}, Held: &leasev1.Amount{Requests: 1 << 40, Tokens: 1 << 40},
		})
	}
	return req
}

// load runs the spenders until an error (the kill) or until stop closes.
func load(addr string, spenders []*crashSpender, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, s := range spenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := leaseClient(testkit.H2CClient(), "http://"+addr)
			for i := 0; i < 1_000_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s.seq++
				s.lastReq, s.pending = crashRequest(s.id, s.seq), true
				ctx, cancel := context.WithTimeout(authed(testToken), 5*time.Second)
				r, err := c.Acquire(ctx, s.lastReq)
				cancel()
				if err != nil {
					return
				}
				s.answered[s.seq], s.lastAns, s.pending = r, s.seq, false
			}
		}()
	}
	wg.Wait()
}

// TestCrashUnderLoad kills the real binary with SIGKILL under load,
// restarts it on the same data directory and checks that every answered
// call survived, that retries get the stored reply instead of a second
// grant, and that all grants together stay within the keys' buckets.
func TestCrashUnderLoad(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte(testToken+"\n"), 0o600)
	args := []string{"-data-dir", filepath.Join(dir, "data"), "-token-file", tokens}

	start := time.Now()
	p := startBinary(t, args...)
	spenders := make([]*crashSpender, 8)
	for i := range spenders {
		spenders[i] = &crashSpender{id: fmt.Sprintf("gw-%d", i), answered: map[uint64]*leasev1.AcquireResponse{}}
	}
	loadDone := make(chan struct{})
	go func() { load(p.addr, spenders, nil); close(loadDone) }()
	time.Sleep(700 * time.Millisecond) // let the load run against the real process
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	<-loadDone
	answeredBefore := 0
	for _, s := range spenders {
		answeredBefore += len(s.answered)
	}
	if answeredBefore < 50 {
		t.Fatalf("only %d calls answered before the kill", answeredBefore)
	}

	p2 := startBinary(t, args...)
	if !strings.Contains(p2.logs.String(), `"not_vouched":0`) {
		t.Fatalf("recovery found state it cannot vouch for:\n%s", p2.logs.String())
	}
	c := leaseClient(testkit.H2CClient(), "http://"+p2.addr)
	for _, s := range spenders {
		// Every answered call is durable: repeating the last one gets the
		// same reply, or "stale" if a later unanswered call was applied.
		if s.lastAns > 0 {
			r, err := c.Acquire(authed(testToken), crashRequest(s.id, s.lastAns))
			switch {
			case err == nil && !proto.Equal(sansSnapshots(r), sansSnapshots(s.answered[s.lastAns])):
				t.Fatalf("%s: repeat of answered call %d got a different reply", s.id, s.lastAns)
			case err != nil && (!s.pending || connect.CodeOf(err) != connect.CodeFailedPrecondition):
				t.Fatalf("%s: repeat of answered call %d: %v", s.id, s.lastAns, err)
			}
		}
		// The call in flight at the kill: its retry is answered once.
		if s.pending {
			r, err := c.Acquire(authed(testToken), s.lastReq)
			if err != nil {
				t.Fatalf("%s: retry of call %d: %v", s.id, s.seq, err)
			}
			again, err := c.Acquire(authed(testToken), s.lastReq)
			if err != nil || !proto.Equal(r, again) {
				t.Fatalf("%s: second retry differs: %v", s.id, err)
			}
			s.answered[s.seq], s.lastAns, s.pending = r, s.seq, false
		}
	}
	stop := make(chan struct{})
	go func() { time.Sleep(300 * time.Millisecond); close(stop) }()
	load(p2.addr, spenders, stop)
	elapsed := time.Since(start)

	// No returns were made, so grants per key are bounded by the bucket:
	// capacity 6000 plus 100 tokens per second.
	granted := map[int]int64{}
	for _, s := range spenders {
		for _, r := range s.answered {
			for k, g := range r.GetKeys() {
				granted[k] += g.GetGranted().GetTokens()
			}
		}
	}
	limit := 6000 + int64(elapsed.Seconds()*100) + 1
	for k := 0; k < 4; k++ {
		if granted[k] > limit {
			t.Errorf("key-%d: granted %d tokens in %v, more than the bucket's %d", k, granted[k], elapsed, limit)
		}
		if granted[k] < 6000 {
			t.Errorf("key-%d: only %d tokens granted; the load did not drain the bucket", k, granted[k])
		}
	}

	// SIGTERM: drains and exits cleanly.
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p2.done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, p2.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if !strings.Contains(p2.logs.String(), "allocator: stopped") {
		t.Fatalf("log:\n%s", p2.logs.String())
	}
}

// sansSnapshots returns a copy of r without its snapshots: the durable copy
// of a stored reply leaves them out, so a retry answered after a restart
// gets them recomputed from the keys' state (docs/allocator.md).
func sansSnapshots(r *leasev1.AcquireResponse) *leasev1.AcquireResponse {
	c := proto.CloneOf(r)
	for _, k := range c.GetKeys() {
		k.Snapshot = nil
	}
	return c
}
