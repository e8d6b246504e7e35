-- The subset of OAR 2.5's PostgreSQL schema that the CDC mapping reads (migration
-- clickhouse/migrations/*_create_oar_cdc.sql), with OAR's own names, types and defaults:
-- times are Unix seconds, 0 while unknown; a job's resources are those of its assigned
-- moldable job. The local OAR database of `make connect` and of the tests is created from it.
CREATE TABLE IF NOT EXISTS jobs (
    job_id serial PRIMARY KEY,
    array_id integer NOT NULL DEFAULT 0,
    job_name varchar(100),
    job_type varchar(11) NOT NULL DEFAULT 'PASSIVE',
    state varchar(16) NOT NULL DEFAULT 'Waiting',
    reservation varchar(10) NOT NULL DEFAULT 'None',
    message varchar(255) NOT NULL DEFAULT '',
    job_user varchar(254) NOT NULL DEFAULT '',
    project varchar(255) NOT NULL DEFAULT '',
    command text,
    exit_code integer,
    queue_name varchar(100) NOT NULL DEFAULT '',
    submission_time integer NOT NULL DEFAULT 0,
    start_time integer NOT NULL DEFAULT 0,
    stop_time integer NOT NULL DEFAULT 0,
    assigned_moldable_job integer DEFAULT 0
);

CREATE TABLE IF NOT EXISTS resources (
    resource_id serial PRIMARY KEY,
    type varchar(100) NOT NULL DEFAULT 'default',
    network_address varchar(100) NOT NULL DEFAULT '',
    host varchar(255),
    state varchar(9) NOT NULL DEFAULT 'Alive',
    cpuset varchar(255) NOT NULL DEFAULT '0'
);

-- cpuset is OAR's own column (a resource's CPU ids); gpudevice a site property (`oarproperty
-- -a gpudevice`: a GPU's index on its node), as Grid'5000 names it. Added to a database made
-- before the allocations (issue 31) read them.
ALTER TABLE resources ADD COLUMN IF NOT EXISTS cpuset varchar(255) NOT NULL DEFAULT '0';
ALTER TABLE resources ADD COLUMN IF NOT EXISTS gpudevice varchar(255);

CREATE TABLE IF NOT EXISTS assigned_resources (
    moldable_job_id integer NOT NULL DEFAULT 0,
    resource_id integer NOT NULL DEFAULT 0,
    assigned_resource_index varchar(7) NOT NULL DEFAULT 'CURRENT',
    PRIMARY KEY (moldable_job_id, resource_id)
);
