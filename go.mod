module github.com/rationhq/ration

go 1.26.8

require (
	connectrpc.com/connect/v2 v2.0.2
	go.etcd.io/bbolt v1.5.0
	google.golang.org/protobuf v1.36.12
	pgregory.net/rapid v1.3.0
)

require golang.org/x/sys v0.45.0 // indirect
