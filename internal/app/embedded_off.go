//go:build noembed

package app

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
)

// embeddedNATS is absent from this build (-tags noembed, as the production image is built):
// it leaves out the nats-server module, 13 MB of the binary.
type embeddedNATS struct{}

func startEmbeddedNATS(string) (*embeddedNATS, error) { return nil, errNoEmbedded }

func (e *embeddedNATS) connect() (*nats.Conn, error) { return nil, errNoEmbedded }
func (e *embeddedNATS) storeDir() string             { return "" }
func (e *embeddedNATS) stop()                        {}

func (e *embeddedNATS) watchStore(ctx context.Context, _ *slog.Logger) error {
	<-ctx.Done()
	return nil
}
