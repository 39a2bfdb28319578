package cluster

import (
	"errors"
	"testing"

	"github.com/hashicorp/raft"
)

// TestNetworkTransportDoesNotPipeline: the transport NewNetworkTransport
// returns has raft's pipelined replication off, so a leader replicates
// with one AppendEntries at a time (see NewNetworkTransport for the
// deadlock pipelining can run into).
func TestNetworkTransportDoesNotPipeline(t *testing.T) {
	tr := NewNetworkTransport(newLayers(t).new([]string{"token"}, plain, 0), nil)
	defer tr.Close()
	if p, err := tr.AppendEntriesPipeline("peer", "127.0.0.1:1"); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("AppendEntriesPipeline: %v, want raft.ErrPipelineReplicationNotSupported", err)
	}
}
