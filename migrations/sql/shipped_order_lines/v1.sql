-- shipped_order_lines(), version 1: the trigger function that marks every line of an order
-- that became shipped as shipped whole (reservation_lines.shipped = quantity).
--
-- Created by migration 0018, which attaches it to reservations (trigger
-- reservations_shipped_lines, AFTER UPDATE OF status, FOR EACH ROW, with a WHEN clause that
-- calls it only when the status became 'shipped'). To change it, add v2.sql beside this file
-- (see ../README.md).
--
-- A shipped order holds nothing: each of its lines shipped all its units (migration 0014).
-- Every writer of this release keeps that by itself (ship_orders() v3 and later set shipped =
-- quantity before the status, record_shipments() and cancel_orders() v4 and the dispatcher's
-- release set the status once no line holds a unit), so for them the UPDATE below finds no
-- row. It is there for a call of ship_orders() version 2, the previous release's worker's,
-- that began before the upgrade to 0014 and later committed: PostgreSQL runs a call to its
-- end with the body it began with, so version 2 marks the order shipped after 0014 set the
-- shipped orders' lines, and leaves its lines at shipped = 0 while stock_levels.shipped went
-- up by them (the invariant check's shipped mismatch). The trigger, committed by the same
-- upgrade, runs in that call's UPDATE of reservations and sets them.

CREATE OR REPLACE FUNCTION shipped_order_lines() RETURNS trigger
LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE reservation_lines AS rl
       SET shipped = rl.quantity
     WHERE rl.order_id = NEW.order_id AND rl.shipped < rl.quantity;
    RETURN NULL;
END;
$function$;

COMMENT ON FUNCTION shipped_order_lines() IS
'Trigger of reservations (reservations_shipped_lines, migration 0018): when an order became
shipped, sets shipped = quantity on each of its lines that shipped less, as a call of
ship_orders() version 2 begun before migration 0014 leaves them.';
