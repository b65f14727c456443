package fusebox

// The stubs in fuseboxpb are generated from the repository's proto and
// committed, as Go convention has it (a `go get` of this module never runs
// a code generator); the proto's go_package names their import path.
// Regenerate after changing the proto with `go generate`,
// which needs protoc (Debian: protobuf-compiler) and the two plugins:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//
//go:generate protoc -I ../../proto --go_out=. --go_opt=module=github.com/fusebox/fusebox/clients/go --go-grpc_out=. --go-grpc_opt=module=github.com/fusebox/fusebox/clients/go fusebox/v1/fusebox.proto
