package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// clusterFlags are the -cluster-* flags. With no -cluster-id the
// allocator runs alone on its journal, as without any of them.
type clusterFlags struct {
	id              string        // this member's raft server id; "" = not a cluster member
	listen          string        // raft's listen address; default: this member's address in peers
	advertise       string        // the address peers dial; default: this member's address in peers
	peers           peerList      // every member: id, raft address, lease API URL
	bootstrap       bool          // form the cluster from peers if this member has no raft state
	forceNew        bool          // start although the raft store lost a member's state (disaster recovery)
	ca              string        // PEM CA bundle: with -tls-cert, peers' TLS is mutual, verified against it
	electionTimeout time.Duration // raft's heartbeat and election timeout; the leader lease is half
}

func (c clusterFlags) on() bool { return c.id != "" }

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.id, "cluster-id", "", "this member's id in -cluster-peers; set, the allocator is a member of a raft cluster (docs/cluster.md); unset, it runs alone on its journal")
	fs.StringVar(&c.listen, "cluster-listen", "", "address raft listens on for its peers (default: this member's address in -cluster-peers)")
	fs.StringVar(&c.advertise, "cluster-advertise", "", "address the peers dial to reach this member (default: its address in -cluster-peers)")
	fs.Var(&c.peers, "cluster-peers", "every member as id=raft-host:port=lease-API-URL, comma-separated, e.g. a=10.0.0.1:7451=http://10.0.0.1:7450,b=...; the URLs are what a follower names as the leader")
	fs.BoolVar(&c.bootstrap, "cluster-bootstrap", false, "form a new cluster of -cluster-peers if this member has no raft state yet (give it to the initial members, never to one being added)")
	fs.BoolVar(&c.forceNew, "cluster-force-new", false, "disaster recovery, once: start although raft.db lost this member's raft log and vote (refused otherwise), forming a new cluster of -cluster-peers from its latest snapshot (or empty without one)")
	fs.StringVar(&c.ca, "cluster-ca", "", "PEM CA bundle; with -tls-cert, raft peers present that certificate and verify each other's against this CA (mutual TLS)")
	fs.DurationVar(&c.electionTimeout, "cluster-election-timeout", time.Second, "raft heartbeat and election timeout (50ms to 1m); a leader that hears from no majority for half of it steps down")
}

// validate checks the flags together and fills the defaults from peers.
// tlsOn reports whether -tls-cert is given.
func (c *clusterFlags) validate(tlsOn bool) error {
	if !c.on() {
		if c.listen != "" || c.advertise != "" || len(c.peers) > 0 || c.bootstrap || c.forceNew || c.ca != "" {
			return errors.New("the -cluster-* flags need -cluster-id")
		}
		return nil
	}
	self, ok := c.peers.find(raft.ServerID(c.id))
	switch {
	case !ok:
		return fmt.Errorf("-cluster-id %q is not in -cluster-peers", c.id)
	case c.ca != "" && !tlsOn:
		return errors.New("-cluster-ca needs -tls-cert and -tls-key (the certificate the member presents to its peers)")
	case c.electionTimeout < 50*time.Millisecond || c.electionTimeout > time.Minute:
		return fmt.Errorf("-cluster-election-timeout %v outside [50ms, 1m]", c.electionTimeout)
	}
	if c.listen == "" {
		c.listen = string(self.raftAddr)
	}
	if c.advertise == "" {
		c.advertise = string(self.raftAddr)
	}
	if host, _, err := net.SplitHostPort(c.advertise); err != nil || host == "" || net.ParseIP(host).IsUnspecified() {
		return fmt.Errorf("-cluster-advertise %q: want the host:port peers dial", c.advertise)
	}
	return nil
}

// member is one entry of -cluster-peers.
type member struct {
	id       raft.ServerID
	raftAddr raft.ServerAddress // host:port the peers dial
	apiURL   string             // lease API base URL, no trailing slash
}

// peerList is the -cluster-peers flag: id=raft-host:port=url entries,
// comma-separated. Setting it again replaces the list.
type peerList []member

func (p *peerList) String() string {
	var parts []string
	for _, m := range *p {
		parts = append(parts, fmt.Sprintf("%s=%s=%s", m.id, m.raftAddr, m.apiURL))
	}
	return strings.Join(parts, ",")
}

func (p *peerList) Set(s string) error {
	var out peerList
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		m, err := parseMember(strings.TrimSpace(entry))
		if err != nil {
			return err
		}
		for _, k := range []string{"id " + string(m.id), "raft address " + string(m.raftAddr), "URL " + m.apiURL} {
			if seen[k] {
				return fmt.Errorf("%s appears twice", k)
			}
			seen[k] = true
		}
		out = append(out, m)
	}
	*p = out
	return nil
}

func parseMember(entry string) (member, error) {
	parts := strings.SplitN(entry, "=", 3)
	if len(parts) != 3 || parts[0] == "" {
		return member{}, fmt.Errorf("peer %q: want id=raft-host:port=lease-API-URL", entry)
	}
	id, addr, rawURL := parts[0], parts[1], parts[2]
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return member{}, fmt.Errorf("peer %q: raft address %q: want host:port", entry, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return member{}, fmt.Errorf("peer %q: raft port %q", entry, port)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return member{}, fmt.Errorf("peer %q: raft address %q is unspecified: give the address peers dial", entry, addr)
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return member{}, fmt.Errorf("peer %q: lease API URL %q: want http(s)://host:port", entry, rawURL)
	}
	return member{id: raft.ServerID(id), raftAddr: raft.ServerAddress(addr), apiURL: u.Scheme + "://" + u.Host}, nil
}

func (p peerList) find(id raft.ServerID) (member, bool) {
	for _, m := range p {
		if m.id == id {
			return m, true
		}
	}
	return member{}, false
}

// urls maps each member's id to its lease API URL.
func (p peerList) urls() map[raft.ServerID]string {
	out := make(map[raft.ServerID]string, len(p))
	for _, m := range p {
		out[m.id] = m.apiURL
	}
	return out
}

// addrs maps each member's id to its raft address.
func (p peerList) addrs() map[raft.ServerID]raft.ServerAddress {
	out := make(map[raft.ServerID]raft.ServerAddress, len(p))
	for _, m := range p {
		out[m.id] = m.raftAddr
	}
	return out
}

// servers is the list as raft's bootstrap configuration.
func (p peerList) servers() []raft.Server {
	out := make([]raft.Server, len(p))
	for i, m := range p {
		out[i] = raft.Server{ID: m.id, Address: m.raftAddr}
	}
	return out
}
