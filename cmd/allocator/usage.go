package main

// envPrefix is what every flag's environment variable starts with: flag
// -data-dir is also RATION_DATA_DIR.
const envPrefix = "RATION_"

// Exit statuses, as -help and docs/allocator.md list them.
const (
	exitFailed  = 1 // the allocator or an operation failed
	exitUsage   = 2 // bad flags or environment
	exitRemoved = 3 // this cluster member was removed from the cluster: do not restart it
)

// opsUsage lists the operations subcommands, one line each.
const opsUsage = `  allocator cluster members -addr URL              list the members as one member knows them
  allocator cluster add     -addr URL -id ID -raft-address HOST:PORT
                                                   add a member (a voter once caught up)
  allocator cluster remove  -addr URL -id ID       remove a member (it then stops, exit status 3)
  allocator backup          -addr URL -out FILE    write the leader's state to FILE (- for stdout)
  allocator restore         -addr URL -in FILE     replace the cluster's state with a backup
  (each: -addr takes every member, comma-separated, and follows a redirect only to one of them;
   it sends the first token of -admin-token-file; -ca FILE for https, -timeout D)
`

// serverUsage is -help's text before the flags.
const serverUsage = `usage:
  allocator [flags]                                serve leases: alone on a journal in -data-dir, or as a
                                                   member of a raft cluster with -cluster-id
` + opsUsage + `'allocator SUBCOMMAND -help' lists a subcommand's flags.

Each flag may also come from the environment variable beside it; the command line wins.
Exit status: 0 stopped by SIGTERM or SIGINT, 1 failed, 2 bad flags, 3 removed from its cluster.

flags:
`
