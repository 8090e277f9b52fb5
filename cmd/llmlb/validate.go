package main

import (
	"context"
	"errors"
)

func runValidate(ctx context.Context, args []string) error {
	return errors.New("not built yet")
}
