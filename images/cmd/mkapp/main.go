// Command mkapp builds a repo-built app's OCI image layout archive
// (images/apps) and prints the values an app manifest's "image" and
// "image_size" take: the archive's sha256 and size (not the digest of the
// OCI manifest inside it; -manifest writes the app manifest with them):
//
//	go run ./images/cmd/mkapp -o bin/apps/hello.oci.tar [-manifest hello.json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/proto"
)

func main() {
	out := flag.String("o", "bin/apps/hello.oci.tar", "where to write the OCI image layout archive")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	manifest := flag.String("manifest", "", "also write the app manifest (gpuaasctl app publish's body, images/apps/manifests/hello.json) naming the archive by its sha256 and size")
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
	if *manifest != "" {
		if err := writeManifest(*manifest, wd, b); err != nil {
			fmt.Fprintln(os.Stderr, "mkapp:", err)
			os.Exit(1)
		}
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(b)
		return
	}
	fmt.Print(summary(b))
}

// writeManifest rewrites the hello manifest at path (or the repository's
// example, under the module root, when path does not exist yet) with b's
// archive digest and size.
func writeManifest(path, root string, b apps.Built) error {
	src, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		src, err = os.ReadFile(filepath.Join(root, "images", "apps", "manifests", "hello.json"))
	}
	if err != nil {
		return err
	}
	var body proto.AppBody
	if err := json.Unmarshal(src, &body); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	body.Image = apps.Hello.Repository + "@sha256:" + b.ArchiveSHA256
	body.ImageSize = b.Size
	out, err := json.MarshalIndent(body, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}

// summary says which value goes where: the app manifest names the
// archive by its sha256, never by the digest of the OCI manifest inside.
func summary(b apps.Built) string {
	return fmt.Sprintf(`%s (%d bytes)
  for the app manifest (gpuaasctl app publish; -manifest FILE writes it):
    "image":      "%s@sha256:%s"
    "image_size": %d
  (the OCI image manifest inside the archive is %s: not the app manifest's image)
`, b.Path, b.Size, apps.Hello.Repository, b.ArchiveSHA256, b.Size, b.Digest)
}
