package e2ee

// When replicas share one PostgreSQL database, an agent's olm account,
// sessions and secrets are written only by the replica holding the
// agent's lease. The journal fences its own writes by the lease's
// generation; the crypto store's writes go through mautrix, which knows
// nothing of leases, so the fence is in the database: every connection of
// a replica's crypto store names the replica (the setting below), and a
// trigger on each table keyed by account refuses a write of a replica
// that does not hold the account's principal's lease (asking the
// journal's principal_lease_holder). A replica paused past its lease, or
// cut off from the database, may still decrypt what its last sync
// brought, but it cannot store the olm sessions it advanced: the new
// owner, which syncs those messages again, finds the sessions as they
// were and decrypts them itself. A daemon running alone sets nothing,
// and nothing is checked.

// replicaSetting is the connection setting naming the replica a crypto
// store's writes speak for.
const replicaSetting = "mindroomd.replica"

// fenceCode is the SQLSTATE of a write the fence refused.
const fenceCode = "ML001"

// installFence (re)creates the fence's trigger function and its trigger
// on every table keyed by account (those shared by all accounts, such as
// devices and the message index, hold facts any replica may record).
const installFence = `
CREATE OR REPLACE FUNCTION crypto_lease_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
DECLARE
	replica text := current_setting('` + replicaSetting + `', true);
	account text;
BEGIN
	IF coalesce(replica, '') <> '' THEN
		IF TG_OP = 'DELETE' THEN
			account := OLD.account_id;
		ELSE
			account := NEW.account_id;
		END IF;
		IF principal_lease_holder(account) IS DISTINCT FROM replica THEN
			RAISE EXCEPTION 'crypto store write refused: replica % does not hold the lease of %', replica, account
				USING ERRCODE = '` + fenceCode + `';
		END IF;
	END IF;
	IF TG_OP = 'DELETE' THEN
		RETURN OLD;
	END IF;
	RETURN NEW;
END
$fence$;
DO $install$
DECLARE
	fenced text;
BEGIN
	FOREACH fenced IN ARRAY ARRAY['crypto_account', 'crypto_olm_session', 'crypto_olm_message_hash',
		'crypto_megolm_inbound_session', 'crypto_megolm_outbound_session', 'crypto_secrets'] LOOP
		EXECUTE format('DROP TRIGGER IF EXISTS lease_fence ON %I', fenced);
		EXECUTE format('CREATE TRIGGER lease_fence BEFORE INSERT OR UPDATE OR DELETE ON %I '
			'FOR EACH ROW EXECUTE FUNCTION crypto_lease_fence()', fenced);
	END LOOP;
END
$install$;
`
