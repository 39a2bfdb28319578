package main

import (
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

const threePeers = "a=10.0.0.1:7451=http://10.0.0.1:7450,b=b.example:7451=https://b.example:7450/,c=10.0.0.3:7451=http://10.0.0.3:7450"

// TestClusterFlags: the -cluster-* flags from the environment and the
// command line, the defaults taken from this member's entry in
// -cluster-peers, and what is refused.
func TestClusterFlags(t *testing.T) {
	env := map[string]string{"RATION_CLUSTER_ID": "b", "RATION_CLUSTER_PEERS": threePeers, "RATION_NO_AUTH": "true"}
	cfg, err := parseConfig([]string{"-cluster-bootstrap", "-cluster-election-timeout", "300ms"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.cluster
	if !c.on() || c.id != "b" || !c.bootstrap || c.electionTimeout != 300*time.Millisecond ||
		c.listen != "b.example:7451" || c.advertise != "b.example:7451" || len(c.peers) != 3 {
		t.Fatalf("cluster flags %+v", c)
	}
	wantURLs := map[raft.ServerID]string{"a": "http://10.0.0.1:7450", "b": "https://b.example:7450", "c": "http://10.0.0.3:7450"}
	if !maps.Equal(c.peers.urls(), wantURLs) {
		t.Fatalf("urls %v, want %v", c.peers.urls(), wantURLs)
	}
	if s := c.peers.servers(); s[2].ID != "c" || s[2].Address != "10.0.0.3:7451" {
		t.Fatalf("servers %v", s)
	}
	if c.peers.String() != strings.Replace(threePeers, "7450/,", "7450,", 1) {
		t.Fatalf("String() = %q", c.peers.String())
	}
	cfg, err = parseConfig([]string{"-no-auth", "-cluster-id", "a", "-cluster-peers", threePeers, "-cluster-listen", "0.0.0.0:9000"}, func(string) string { return "" }, io.Discard)
	if err != nil || cfg.cluster.listen != "0.0.0.0:9000" || cfg.cluster.advertise != "10.0.0.1:7451" {
		t.Fatalf("explicit listen: %+v %v", cfg.cluster, err)
	}
	if cfg, err := parseConfig([]string{"-no-auth"}, func(string) string { return "" }, io.Discard); err != nil || cfg.cluster.on() {
		t.Fatalf("no cluster flags: %+v %v", cfg.cluster, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-cluster-peers", threePeers}, "need -cluster-id"},
		{[]string{"-cluster-bootstrap"}, "need -cluster-id"},
		{[]string{"-cluster-force-new"}, "need -cluster-id"},
		{[]string{"-cluster-id", "d", "-cluster-peers", threePeers}, `"d" is not in -cluster-peers`},
		{[]string{"-cluster-id", "a"}, "not in -cluster-peers"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a"}, "want id=raft-host:port=lease-API-URL"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "=h:1=http://h:2"}, "want id=raft-host:port=lease-API-URL"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h=http://h:2"}, "want host:port"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h:99999=http://h:2"}, "raft port"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=0.0.0.0:1=http://h:2"}, "unspecified"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h:1=ftp://h:2"}, "want http(s)://host:port"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h:1=http://h:2/api"}, "want http(s)://host:port"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h:1=http://h:2,a=g:1=http://g:2"}, "id a appears twice"},
		{[]string{"-cluster-id", "a", "-cluster-peers", "a=h:1=http://h:2,b=h:1=http://g:2"}, "raft address h:1 appears twice"},
		{[]string{"-cluster-id", "a", "-cluster-peers", threePeers, "-cluster-ca", "ca.pem"}, "-cluster-ca needs -tls-cert"},
		{[]string{"-cluster-id", "a", "-cluster-peers", threePeers, "-cluster-election-timeout", "10ms"}, "outside [50ms, 1m]"},
		{[]string{"-cluster-id", "a", "-cluster-peers", threePeers, "-cluster-advertise", "0.0.0.0:7451"}, "-cluster-advertise"},
	} {
		_, err := parseConfig(append([]string{"-no-auth"}, tc.args...), func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
