package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect/v2"
	"github.com/hashicorp/raft"

	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/internal/testkit"
)

// TestCredentialFlags: a cluster member needs the admin and peer
// credentials (mutual TLS may stand for the peer's), the gateway's token
// file alone is refused naming what is missing, and the admin and peer
// files are refused outside a cluster.
func TestCredentialFlags(t *testing.T) {
	dir := t.TempDir()
	gw, admin, peer := writeTokens(t, dir, "gw", "g"), writeTokens(t, dir, "admin", "a"), writeTokens(t, dir, "peer", "p")
	cluster := []string{"-cluster-id", "a", "-cluster-peers", threePeers}
	for _, tc := range []struct {
		args []string
		want string // "" = accepted
	}{
		{append([]string{"-token-file", gw, "-admin-token-file", admin, "-peer-token-file", peer}, cluster...), ""},
		{append([]string{"-token-file", gw, "-admin-token-file", admin, "-tls-cert", "c", "-tls-key", "k", "-cluster-ca", "ca"}, cluster...), ""},
		{append([]string{"-no-auth"}, cluster...), ""},
		{append([]string{"-token-file", gw}, cluster...), "a cluster member needs -admin-token-file and -peer-token-file (or mutual TLS with -cluster-ca): -token-file is the gateways' credential"},
		{append([]string{"-token-file", gw, "-admin-token-file", admin}, cluster...), "needs -peer-token-file"},
		{append([]string{"-token-file", gw, "-peer-token-file", peer}, cluster...), "needs -admin-token-file:"},
		{[]string{"-token-file", gw, "-admin-token-file", admin}, "need -cluster-id"},
		{[]string{"-token-file", gw, "-peer-token-file", peer}, "need -cluster-id"},
		{append([]string{"-no-auth", "-peer-token-file", peer}, cluster...), "-no-auth excludes"},
	} {
		_, err := parseConfig(tc.args, func(string) string { return "" }, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	env := map[string]string{"RATION_TOKEN_FILE": gw, "RATION_ADMIN_TOKEN_FILE": admin, "RATION_PEER_TOKEN_FILE": peer}
	cfg, err := parseConfig(cluster, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.adminTokenFile != admin || cfg.peerTokenFile != peer {
		t.Fatalf("from the environment: %+v %v", cfg, err)
	}
}

// TestCredentialsAreDistinct: a token in the files of two roles is
// refused at start, naming both files and never the token; distinct files
// are read whole (rotation: every line is accepted).
func TestCredentialsAreDistinct(t *testing.T) {
	dir := t.TempDir()
	cfg := config{tokenFile: writeTokens(t, dir, "gw", "g1", "g2"), adminTokenFile: writeTokens(t, dir, "admin", "a1", "a2"),
		peerTokenFile: writeTokens(t, dir, "peer", "p1")}
	c, err := readCredentials(cfg)
	if err != nil || len(c.gateway) != 2 || len(c.admin) != 2 || len(c.peer) != 1 {
		t.Fatalf("%+v %v", c, err)
	}
	for _, tc := range []struct {
		name         string
		cfg          config
		flag1, flag2 string
	}{
		{"gateway token as peer secret", config{tokenFile: cfg.tokenFile, adminTokenFile: cfg.adminTokenFile, peerTokenFile: writeTokens(t, dir, "p2", "p1", "g2")}, "-token-file", "-peer-token-file"},
		{"admin token as gateway token", config{tokenFile: writeTokens(t, dir, "g3", "a1"), adminTokenFile: cfg.adminTokenFile}, "-token-file", "-admin-token-file"},
		{"one file for two roles", config{tokenFile: cfg.tokenFile, adminTokenFile: cfg.adminTokenFile, peerTokenFile: cfg.adminTokenFile}, "-admin-token-file", "-peer-token-file"},
	} {
		_, err := readCredentials(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.flag1+" (") || !strings.Contains(err.Error(), tc.flag2+" (") ||
			!strings.Contains(err.Error(), "hold the same token") {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, secret := range []string{"g1", "g2", "a1", "a2", "p1"} {
			if strings.Contains(err.Error(), " "+secret) || strings.Contains(err.Error(), secret+" ") {
				t.Errorf("%s: the error echoes a token: %v", tc.name, err)
			}
		}
	}
}

// TestEachCredentialOpensOneRole: on a cluster member, the gateway token
// opens the lease API only, the admin token the admin API only, and the
// peer secret raft only: each of the others is refused there (401,
// Unauthenticated, a refused handshake), and raft also refuses a peer
// that proves the secret but is not a member (logged first: refusals are
// logged at a sampled rate).
func TestEachCredentialOpensOneRole(t *testing.T) {
	p := freePorts(t, 2)
	raftAddr := fmt.Sprintf("127.0.0.1:%d", p[0])
	ts := startServer(t, testConfig(t, "-listen", fmt.Sprintf("127.0.0.1:%d", p[1]), "-cluster-id", "solo",
		"-cluster-peers", fmt.Sprintf("solo=%s=http://127.0.0.1:%d", raftAddr, p[1]), "-cluster-bootstrap", "-cluster-election-timeout", "100ms"))
	base := "http://" + ts.addr

	admin := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/admin/cluster", nil)
		return statusWith(t, req, token)
	}
	for tok, want := range map[string]int{testAdminToken: 200, testToken: 401, "other-token": 401, testPeerToken: 401} {
		if got := admin(tok); got != want {
			t.Errorf("admin API with %q: %d, want %d", tok, got, want)
		}
	}
	c := leaseClient(testkit.H2CClient(), base)
	for i, tok := range []string{testAdminToken, testPeerToken} {
		if _, err := c.Acquire(authed(tok), acquireReq("s", uint64(i+1), "k")); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("lease API with %q: %v, want Unauthenticated", tok, err)
		}
	}
	if _, err := c.Acquire(authed(testToken), acquireReq("s", 1, "k")); err != nil {
		t.Errorf("lease API with the gateway token: %v", err)
	}

	members := func() map[raft.ServerID]raft.ServerAddress {
		return map[raft.ServerID]raft.ServerAddress{"solo": raft.ServerAddress(raftAddr), "intruder": "127.0.0.1:1"}
	}
	for i, secret := range []string{testPeerToken, testToken, testAdminToken} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		sl, err := cluster.NewStreamLayer(cluster.StreamConfig{Listener: ln, ID: "intruder", Members: members, Tokens: []string{secret}})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := sl.Dial(raft.ServerAddress(raftAddr), time.Second)
		if !errors.Is(err, cluster.ErrPeerRefused) || secret != testPeerToken && !strings.Contains(err.Error(), "proved no accepted peer secret") {
			t.Errorf("raft with %q as the secret: %v, want refused", secret, err)
			conn.Close()
		}
		sl.Close()
		want := fmt.Sprintf(`ration_allocator_raft_peer_refused_total{direction="in"} %d`, i+1)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, body := getBody(t, base+"/metrics"); strings.Contains(body, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the member did not count the refusal: want %s", want)
			}
		}
	}
	if reason := `names itself \"intruder\", not a member`; !strings.Contains(ts.log.String(), reason) {
		t.Errorf("the member's log does not say %q:\n%s", reason, ts.log.String())
	}
}
