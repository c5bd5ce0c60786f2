// Command printversion prints version.Get as JSON, for the package's test
// of the -ldflags path.
package main

import (
	"encoding/json"
	"os"

	"github.com/coordinatord/coordinatord/internal/version"
)

func main() {
	_ = json.NewEncoder(os.Stdout).Encode(version.Get())
}
