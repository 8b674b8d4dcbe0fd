-- What a writer may put in the columns that order delivery, bounded in the
-- table itself, as on PostgreSQL (relay/store/migrations/0005_writer_bounds.sql):
-- priority from -1000 to 1000, deliver_at at most 366 days from now. Any role
-- that may INSERT could otherwise hold a key back for good ('9999-12-31') or go
-- before every other writer's events (priority 2147483647).
--
-- A trigger, not CHECK constraints: a CHECK may not read the clock (MariaDB
-- error 1901, MySQL 3814), adding one copies the table while writers wait, and
-- a CHECK would also judge the relay's updates of rows already there. The
-- trigger judges only what is inserted; creating it changes only the
-- catalog. SQLSTATE 45000 with the column named, on both servers.
--
-- Creating a trigger asks for the TRIGGER privilege, and with binary logging on
-- (MySQL 8's default) for SUPER or log_bin_trust_function_creators = 1
-- (docs/mysql.md).
CREATE TRIGGER {writer_bounds_trigger} BEFORE INSERT ON {table} FOR EACH ROW
    -- (One statement, its semicolons inside lines: the script's statements end at a line's end.)
    IF NEW.priority NOT BETWEEN -1000 AND 1000 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'priority is out of range: from -1000 to 1000'; ELSEIF
        NEW.deliver_at > UTC_TIMESTAMP(6) + INTERVAL 366 DAY THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deliver_at is more than 366 days from now'; END IF;
