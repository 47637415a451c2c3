// Command mkapp builds a repo-built app's OCI image layout archive
// (images/apps) and prints its image reference by digest, the value an app
// manifest's "image" field takes:
//
//	go run ./images/cmd/mkapp -o bin/apps/hello.oci.tar
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
)

func main() {
	out := flag.String("o", "bin/apps/hello.oci.tar", "where to write the OCI image layout archive")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	wd, err := os.Getwd()
	if err == nil {
		wd, err = guest.FindModuleRoot(wd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkapp:", err)
		os.Exit(1)
	}
	b, err := apps.Build(context.Background(), wd, apps.Hello, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkapp:", err)
		os.Exit(1)
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(b)
		return
	}
	fmt.Printf("%s\n  image  %s\n  sha256 %s (%d bytes, the archive)\n", b.Path, b.Ref, b.ArchiveSHA256, b.Size)
}
