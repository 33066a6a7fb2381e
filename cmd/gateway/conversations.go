package main

import (
	"log/slog"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
)

// openConversations opens the conversation store when [conversations] is
// on: in Redis when [redis] is set, shared by every replica (one of them
// ends each conversation), else in the process, kept in [conversations]
// state_file across restarts. onEnd receives each ended conversation.
func (g *governance) openConversations(cfg *config.Config, log *slog.Logger,
	onEnd func(conversation.Conversation, conversation.Reason)) error {
	cc := cfg.Conversations
	if !cc.Enabled {
		return nil
	}
	opts := conversation.Options{IdleTimeout: cc.IdleTimeout(), MaxActive: cc.MaxActive,
		Interval: cc.FlushInterval(), OnEnd: onEnd}
	if g.redis != nil {
		store, err := conversation.NewRedis(g.redis, conversation.RedisOptions{Options: opts,
			Prefix: cfg.Redis.KeyPrefix, Logger: log})
		if err != nil {
			return err
		}
		g.conv = store
		return nil
	}
	if file := cc.StateFile; file != "" {
		lock, err := lockFile(file+".lock", "[conversations] state_file "+file)
		if err != nil {
			return err
		}
		g.convLock = lock
	}
	store, err := conversation.NewLocal(conversation.LocalOptions{Options: opts, File: cc.StateFile, Logger: log})
	if err != nil {
		return err
	}
	g.conv = store
	return nil
}
