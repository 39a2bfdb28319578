package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/internal/testkit"
)

// op runs an operations subcommand as main would, with the admin token
// file, and returns its output.
func op(t *testing.T, tokens string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := runOp(context.Background(), append(args, "-admin-token-file", tokens), func(string) string { return "" }, &out)
	return out.String(), err
}

// leaderOf returns the URL of the member GET /admin/cluster names as the
// leader, and one that is not.
func leaderOf(t *testing.T, tokens string, urls ...string) (leader, follower string) {
	t.Helper()
	out, err := op(t, tokens, "cluster", "members", "-addr", urls[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "\t")
		if strings.HasSuffix(f[3], "leader") {
			leader = f[2]
		}
	}
	for _, u := range urls {
		if u != leader {
			follower = u
		}
	}
	if leader == "" || follower == "" {
		t.Fatalf("members:\n%s", out)
	}
	return leader, follower
}

// readBackup reads the backup file at path.
func readBackup(t *testing.T, path string) cluster.BackupContents {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.ReadBackup(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestOperations: through the subcommands, against members' admin API
// (a follower redirects to the leader): a third member is added to a
// two-member cluster and catches up, listed, then removed; a backup of
// the leader restored into a new one-member cluster carries the state
// byte for byte, so a call retried there gets its stored reply; a
// damaged backup is refused with nothing changed, and so is removing the
// last member (409); the admin API needs the admin token.
func TestOperations(t *testing.T) {
	p := freePorts(t, 8)
	url := func(i int) string { return fmt.Sprintf("http://127.0.0.1:%d", p[2*i]) }
	peer := func(id string, i int) string { return fmt.Sprintf("%s=127.0.0.1:%d=%s", id, p[2*i+1], url(i)) }
	two := peer("a", 0) + "," + peer("b", 1)
	member := func(id string, i int, peers string, extra ...string) *testServer {
		cfg := testConfig(t, append([]string{"-listen", strings.TrimPrefix(url(i), "http://"), "-cluster-id", id, "-cluster-peers", peers,
			"-cluster-election-timeout", "100ms", "-sweep-interval", "1h"}, extra...)...)
		return startServerUnready(t, cfg)
	}
	a := member("a", 0, two, "-cluster-bootstrap")
	member("b", 1, two, "-cluster-bootstrap")
	waitReady(t, url(0), http.DefaultClient)
	waitReady(t, url(1), http.DefaultClient)
	tokens := a.cfg.adminTokenFile
	leader, follower := leaderOf(t, tokens, url(0), url(1))

	// Add c, started without bootstrap, through the follower: refused
	// while -addr does not list the leader it redirects to (the token goes
	// only to listed members), done once it does.
	member("c", 2, two+","+peer("c", 2))
	addC := func(addr string) (string, error) {
		return op(t, tokens, "cluster", "add", "-addr", addr, "-id", "c", "-raft-address", fmt.Sprintf("127.0.0.1:%d", p[5]))
	}
	if out, err := addC(follower); err == nil || !strings.Contains(err.Error(), "which -addr does not list") {
		t.Fatalf("add through the follower alone: %q %v, want the redirect refused", out, err)
	}
	if out, err := addC(follower + "," + leader); err != nil || !strings.HasPrefix(out, "added c") {
		t.Fatalf("add: %q %v", out, err)
	}
	waitReady(t, url(2), http.DefaultClient)
	// c lists itself once the configuration entry reaches it (it may know
	// the leader from a heartbeat first).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := op(t, tokens, "cluster", "members", "-addr", url(2))
		if err == nil && strings.Count(out, "\tvoter") == 3 && strings.Contains(out, "c\t127.0.0.1:") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members after add: %q %v", out, err)
		}
	}

	// A grant, then a backup of it through the follower.
	req := acquireReq("gw", 1, "k")
	first, err := leaseClient(testkit.H2CClient(), leader).Acquire(authed(testToken), req)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "backup")
	if out, err := op(t, tokens, "backup", "-addr", follower+","+leader, "-out", file); err != nil || !strings.HasPrefix(out, "backup: ") {
		t.Fatalf("backup: %q %v", out, err)
	}

	// Remove c again.
	if out, err := op(t, tokens, "cluster", "remove", "-addr", leader, "-id", "c"); err != nil || out != "removed c\n" {
		t.Fatalf("remove: %q %v", out, err)
	}
	if out, err := op(t, tokens, "cluster", "members", "-addr", leader); err != nil || strings.Count(out, "\tvoter") != 2 || strings.Contains(out, "c\t") {
		t.Fatalf("members after remove: %q %v", out, err)
	}
	if _, err := op(t, tokens, "cluster", "remove", "-addr", leader, "-id", "c"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("removing a non-member: %v", err)
	}

	// Restore into a new one-member cluster.
	member("solo", 3, peer("solo", 3), "-cluster-bootstrap")
	waitReady(t, url(3), http.DefaultClient)
	if out, err := op(t, tokens, "restore", "-addr", url(3), "-in", file); err != nil || !strings.HasPrefix(out, "restored ") {
		t.Fatalf("restore: %q %v", out, err)
	}
	again := filepath.Join(t.TempDir(), "again")
	if _, err := op(t, tokens, "backup", "-addr", url(3), "-out", again); err != nil {
		t.Fatal(err)
	}
	if want, got := readBackup(t, file), readBackup(t, again); !bytes.Equal(got.State, want.State) || got.Now != want.Now {
		t.Fatalf("the restored member's state differs from the one restored (%d vs %d bytes)", len(got.State), len(want.State))
	}
	retry, err := leaseClient(testkit.H2CClient(), url(3)).Acquire(authed(testToken), req)
	if err != nil || !proto.Equal(sansSnapshots(retry), sansSnapshots(first)) {
		t.Fatalf("the call retried after the restore: %v %v, want the stored reply %v", retry, err, first)
	}

	// Refusals. (The retry was applied through the log, as a command
	// answered from its session: the state's last index and instant moved.)
	if _, err := op(t, tokens, "backup", "-addr", url(3), "-out", again); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(again)
	flipped := bytes.Clone(before)
	flipped[len(flipped)-2] ^= 1
	for _, bad := range []struct{ name, data, reason string }{
		{"not a backup", "not a backup", "not a ration backup"},
		{"a flipped byte", string(flipped), "checksum mismatch"},
	} {
		path := filepath.Join(t.TempDir(), "bad")
		os.WriteFile(path, []byte(bad.data), 0o600)
		if _, err := op(t, tokens, "restore", "-addr", url(3), "-in", path); err == nil || !strings.Contains(err.Error(), "400") ||
			!strings.Contains(err.Error(), bad.reason) {
			t.Fatalf("%s: %v", bad.name, err)
		}
		op(t, tokens, "backup", "-addr", url(3), "-out", again)
		if got, _ := os.ReadFile(again); !bytes.Equal(got, before) {
			t.Fatalf("%s: a refused restore changed the state", bad.name)
		}
	}
	if _, err := op(t, tokens, "cluster", "remove", "-addr", url(3), "-id", "solo"); err == nil || !strings.Contains(err.Error(), "409") ||
		!strings.Contains(err.Error(), "last voter") {
		t.Fatalf("removing the last member: %v, want 409 saying why", err)
	}
	resp, err := http.Get(url(3) + "/admin/cluster")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin without a token: %d", resp.StatusCode)
	}
	for _, args := range [][]string{
		{"cluster"}, {"cluster", "grow"}, {"cluster", "add", "-addr", url(3)}, {"cluster", "add", "-addr", url(3), "-id", "x"},
		{"cluster", "remove", "-addr", url(3)}, {"backup", "-addr", url(3)}, {"restore", "-addr", "ftp://x", "-in", file},
	} {
		if _, err := op(t, tokens, args...); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	// The restore kept the new cluster's own membership.
	if out, err := op(t, tokens, "cluster", "members", "-addr", url(3)); err != nil || out != fmt.Sprintf("solo\t127.0.0.1:%d\t%s\tvoter leader\n", p[7], url(3)) {
		t.Fatalf("members of the restored cluster: %q %v", out, err)
	}
}
