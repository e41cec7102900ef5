// Command etcd is a minimal single-member etcd for the k0s-fleet test world,
// built on go.etcd.io/etcd/server/v3/embed so that the version is pinned by
// Go modules instead of a downloaded release archive.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for etcd data (required)")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	quotaBytes := flag.Int64("quota-backend-bytes", 2<<30, "backend quota in bytes")
	unsafeNoFsync := flag.Bool("unsafe-no-fsync", false, "skip fsync (tests only)")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "test-world"
	cfg.LogLevel = "warn"
	cfg.QuotaBackendBytes = *quotaBytes
	cfg.UnsafeNoFsync = *unsafeNoFsync
	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("bad --listen-client-urls: %v", err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("bad --listen-peer-urls: %v", err)
	}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	select {
	case <-server.Server.ReadyNotify():
		log.Printf("etcd ready on %s", cu.String())
	case <-time.After(60 * time.Second):
		server.Close()
		log.Fatal("etcd did not become ready within 60s")
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stop:
	case err := <-server.Err():
		log.Printf("etcd error: %v", err)
	}
	server.Close()
}
