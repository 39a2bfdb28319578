package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rationhq/ration/allocator"
	"github.com/rationhq/ration/allocator/cluster"
)

// openMember starts this allocator as a member of the raft cluster the
// -cluster-* flags describe: raft on its own listener, its peers
// authenticated with the peer tokens (the first one proven, any
// accepted; none with -no-auth or under mutual TLS alone) and, with
// -tls-cert, over TLS (mutual with -cluster-ca); the raft log in <data-dir>/raft.db and snapshots in
// <data-dir>/snapshots. With -cluster-bootstrap, a member without raft
// state forms the cluster of -cluster-peers; a raft.db that lost a
// member's state is refused unless -cluster-force-new.
//
// It returns the member and the stream layer, whose record of the peers'
// answers the admin API's membership changes go by.
func openMember(cfg config, tokens []string, reg prometheus.Registerer, log *slog.Logger, opts []allocator.Option) (*allocator.Member, *cluster.StreamLayer, error) {
	cf := cfg.cluster
	if _, err := os.Stat(filepath.Join(cfg.dataDir, "allocator.db")); err == nil {
		log.Warn("allocator: the data directory holds a journal (allocator.db) from a run without -cluster-id; a cluster member does not read it")
	}
	if len(tokens) == 0 && cf.ca == "" {
		log.Warn("allocator: raft peers are not authenticated (-no-auth)")
	}
	// A peer may be a member of -cluster-peers or of raft's configuration
	// (a member added through the admin API); the node exists once the
	// transport does.
	var node atomic.Pointer[cluster.Node]
	members := func() map[raft.ServerID]raft.ServerAddress {
		m := cf.peers.addrs()
		if n := node.Load(); n != nil {
			if servers, err := n.Members(); err == nil {
				for _, s := range servers {
					m[s.ID] = s.Address
				}
			}
		}
		return m
	}
	sc := cluster.StreamConfig{ID: raft.ServerID(cf.id), Members: members, Tokens: tokens, Logger: log, Advertise: advertiseAddr(cf.advertise)}
	if cfg.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return nil, nil, fmt.Errorf("tls: %w", err)
		}
		var pool *x509.CertPool
		if cf.ca != "" {
			pem, err := os.ReadFile(cf.ca)
			if err != nil {
				return nil, nil, fmt.Errorf("-cluster-ca: %w", err)
			}
			if pool = x509.NewCertPool(); !pool.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("-cluster-ca %s: no PEM certificate", cf.ca)
			}
		}
		sc.ServerTLS, sc.ClientTLS = cluster.PeerTLS(cert, pool)
	}
	ln, err := net.Listen("tcp", cf.listen)
	if err != nil {
		return nil, nil, fmt.Errorf("-cluster-listen: %w", err)
	}
	sc.Listener = ln
	sl, err := cluster.NewStreamLayer(sc)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	trans := cluster.NewNetworkTransport(sl, log)
	et := cf.electionTimeout
	nodeOpts := []cluster.Option{
		cluster.WithBoltStore(filepath.Join(cfg.dataDir, "raft.db")),
		cluster.WithFileSnapshots(filepath.Join(cfg.dataDir, "snapshots"), 2),
		cluster.WithRaftConfig(func(c *raft.Config) {
			c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = et, et, et/2
		}),
		cluster.WithAPIURLs(cf.peers.urls()),
	}
	if cf.forceNew {
		nodeOpts = append(nodeOpts, cluster.WithForceNew(cf.peers.servers()))
	}
	led, err := allocator.NewReplicated(allocator.ClusterConfig{
		ID: raft.ServerID(cf.id), Transport: trans, Node: nodeOpts}, opts...)
	if errors.Is(err, cluster.ErrLostState) {
		err = fmt.Errorf("%w (-cluster-force-new)", err)
	}
	if err != nil {
		trans.Close()
		return nil, nil, err
	}
	node.Store(led.Node())
	for _, r := range []func(prometheus.Registerer) error{led.Node().RegisterMetrics, sl.RegisterMetrics} {
		if err := r(reg); err != nil {
			led.Close()
			return nil, nil, err
		}
	}
	if cf.bootstrap {
		switch err := led.Node().Bootstrap(cf.peers.servers()...); {
		case errors.Is(err, raft.ErrCantBootstrap):
			log.Info("allocator: raft state found; resuming it, not bootstrapping")
		case err != nil:
			led.Close()
			return nil, nil, fmt.Errorf("bootstrap: %w", err)
		default:
			log.Info("allocator: bootstrapped a new cluster", "members", cf.peers.String())
		}
	}
	log.Info("allocator: cluster member", "id", cf.id, "raft_listen", cf.listen, "raft_advertise", cf.advertise,
		"tls", sc.ServerTLS != nil, "mutual_tls", cf.ca != "", "election_timeout", et.String())
	return led, sl, nil
}

// handOver, on a leader about to stop, hands the leadership to another
// member, so the cluster serves again without waiting for an election
// timeout. It does nothing on a follower or outside a cluster.
func handOver(node *cluster.Node, log *slog.Logger) {
	if node == nil || !node.IsLeader() {
		return
	}
	if err := node.Raft().LeadershipTransfer().Error(); err != nil {
		log.Warn("allocator: leadership not handed over before stopping", "err", err)
		return
	}
	log.Info("allocator: leadership handed over")
}

// advertiseAddr is the address the peers dial, as given: a host name
// stays a name (raft dials what the configuration holds).
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }
