-- v8: the lease's fence beyond the journal. The agents' crypto store keys
-- an agent's olm account by "<agent>@<user_id>" (an agent's name holds no
-- "@"); its tables ask here which replica holds that principal's lease
-- before a write. The row is share-locked, so a takeover's bump and such
-- a write are ordered: a write after the bump sees the new holder.
CREATE FUNCTION principal_lease_holder(account text) RETURNS text
    LANGUAGE sql VOLATILE
    AS $$
        SELECT lease_holder FROM principals
        WHERE agent = split_part(account, '@', 1) AND user_id = substr(account, strpos(account, '@') + 1)
        FOR SHARE
    $$;
