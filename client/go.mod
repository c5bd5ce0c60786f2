// Module client is coordinatord's Go SDK. It depends on grpc, protobuf and
// the generated API (../api) only; TestSDKDependencies holds it to that,
// and to Go 1.24 (see ../api/go.mod). Its tests use goleak too.
module github.com/coordinatord/coordinatord/client

go 1.24.0

replace github.com/coordinatord/coordinatord/api => ../api

require (
	github.com/coordinatord/coordinatord/api v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260120221211-b8f7ae30c516
	google.golang.org/grpc v1.80.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
)
