// Package proto holds the protobuf definitions of the plugin services
// (tetherv1) and the generated Go code, which is committed. Regenerate with
// `go generate ./contract/proto`; the generators are pinned by version.
package proto

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
